"""The decoders benchmark, run for real on the test tiny-gpt2 on the CPU with a few requests."""

from benchmarks import decoders as bd


def test_every_contender_decodes_every_request_to_its_budget_and_agrees(model_dir):
    budgets = [3, 9, 5, 12, 1, 7]
    outcomes = bd.measure(model_dir / "tiny-gpt2", "cpu", budgets)
    assert [o.name for o in outcomes] == ["static generate", "transformers CB", "Fibermill"]
    assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
    static = outcomes[0].run
    for o in outcomes:
        assert o.run.tokens == budgets, o.name  # no EOS ends a row early
        assert o.run.seconds > 0
    # Greedy: the decoder's rows give generate's tokens, whatever rows run beside them.
    assert outcomes[2].run.texts == static.texts


def test_a_contender_that_fails_is_reported_and_the_others_still_run(model_dir, monkeypatch):
    def broken(*args):
        raise RuntimeError("no kernel for this device")

    monkeypatch.setitem(bd.CONTENDERS, "transformers CB", broken)
    budgets = [4, 2]
    outcomes = bd.measure(model_dir / "tiny-gpt2", "cpu", budgets)
    assert [o.error is None for o in outcomes] == [True, False, True]
    text = "\n".join(bd.report({"mixed": outcomes}, {"mixed": budgets}))
    assert "| transformers CB | failed: RuntimeError: no kernel for this device | | | |" in text
    assert "| Fibermill |" in text and "| 1.00x | 2/2 |" in text
