"""The peers benchmark's pure helpers (no benchmark runs here)."""

import asyncio

import pytest

from benchmarks import peers as bp
from shared.registry import ModelRegistry


def test_percentile_interpolates_between_ranks():
    assert bp.percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert bp.percentile([4.0, 1.0, 3.0, 2.0], 0.0) == 1.0
    assert bp.percentile([4.0, 1.0, 3.0, 2.0], 1.0) == 4.0
    assert bp.percentile([7.0], 0.9) == 7.0
    with pytest.raises(ValueError):
        bp.percentile([], 0.5)


def test_ratio_formats_and_leaves_missing_sides_out():
    assert bp.ratio(3.0, 2.0) == "1.50x"
    assert bp.ratio(None, 2.0) == "-"
    assert bp.ratio(1.0, 0.0) == "-"


def test_mixed_budgets_are_seeded_and_in_range():
    budgets = bp.mixed_budgets(500, seed=3)
    assert budgets == bp.mixed_budgets(500, seed=3)
    assert budgets != bp.mixed_budgets(500, seed=4)
    assert len(budgets) == 500
    assert min(budgets) >= 8 and max(budgets) <= 128
    assert min(budgets) == 8 and max(budgets) == 128  # both ends are drawn (inclusive range)


def test_static_batches_keep_arrival_order():
    batches = bp.static_batches(list(range(70)), 32)
    assert [len(b) for b in batches] == [32, 32, 6]
    assert [i for b in batches for i in b] == list(range(70))


def test_continuous_bound_counts_the_steps_each_way():
    # Equal budgets: static batches waste nothing, so there is nothing to gain.
    assert bp.continuous_bound([5] * 64, 32) == 1.0
    # Two slots, budgets 1, 4, 1, 4: static batches take 4 + 4 steps. Continuously, slot A
    # takes the first 1, the second 1 when it frees at step 1 and the second 4 at step 2
    # (ending at 6), while slot B runs the first 4: 8 / 6.
    assert bp.continuous_bound([1, 4, 1, 4], 2) == pytest.approx(8 / 6)
    # The fewer the requests, the more of the run is a tail with few rows: the bound grows
    # with the requests towards the endless stream's.
    few, many = (bp.continuous_bound(bp.mixed_budgets(n)) for n in (128, 4096))
    assert few < many < bp._stream_bound()


def test_stream_bound_is_the_expected_longest_over_the_mean():
    assert bp._stream_bound(1, 1, 2) == 1.0  # one slot: the longest is the budget itself
    # Two slots, budgets 1 or 2: the longer of two is 1 only if both are (1/4), so it is
    # 1/4 + 2 * 3/4 = 7/4 on average, against a mean budget of 3/2.
    assert bp._stream_bound(2, 1, 2) == pytest.approx(7 / 6)


def test_closed_loop_keeps_at_most_concurrency_in_flight():
    in_flight, most = 0, 0
    seen = []

    async def send(budget: int) -> int:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1
        seen.append(budget)
        return budget

    budgets = list(range(20))
    load = asyncio.run(bp.closed_loop(send, budgets, 4))
    assert most == 4
    assert sorted(seen) == budgets
    assert load.tokens == budgets  # in request order
    assert load.n == 20 and all(lat > 0 for lat in load.latencies)


def test_median_round_is_the_middle_by_requests_per_second():
    fast, slow, mid = (bp.Load(s, [s / 4] * 4) for s in (1.0, 4.0, 2.0))
    load = bp.median_round([fast, slow, mid])
    assert load.seconds == 2.0 and load.latencies == mid.latencies
    assert load.rounds == [4.0, 1.0, 2.0]  # every round's req/s, in run order
    assert bp.median_round([fast, slow]).seconds == 4.0  # the lower middle of two
    assert bp.median_round([fast]) is fast  # one round: as it is, no rounds to show
    with pytest.raises(ValueError):
        bp.median_round([])


def test_rounds_are_reported_beside_the_median():
    load = bp.median_round([bp.Load(s, [0.1] * 4, [16] * 4) for s in (1.0, 2.0, 4.0)])
    results = {"sizes": bp.FULL, "errors": [], "mixed_budgets": [8], "seconds": 1.0,
               ("tiny-gpt2", "fibermill c32"): load}
    text = "\n".join(bp.report(results))
    assert "| Fibermill end to end, c=32 | 4 | 2.0 | 100.0 | 16 | 4.0, 2.0, 1.0 |" in text


def test_registry_serves_both_models_at_batch_32(tmp_path):
    path = bp.write_registry(tmp_path / "registry.yaml", tmp_path / "big")
    registry = ModelRegistry.load(path)
    tiny, big = registry.get(bp.TINY.model), registry.get(bp.BIG.model)
    assert tiny.max_batch == big.max_batch == 32
    assert tiny.path.name == "tiny-gpt2" and tiny.path.is_absolute()
    assert big.path == tmp_path / "big"
    assert big.defaults.max_new_tokens == 64 and big.limits.max_new_tokens == 128


def test_report_shows_missing_measurements_as_dashes():
    load = bp.Load(2.0, [0.1, 0.2, 0.3, 0.4], [16, 16, 16, 16])
    budgets = [8, 100, 16, 64]
    results = {"sizes": bp.QUICK, "errors": ["LitServe is not installed"],
               "mixed_budgets": budgets, "seconds": 1.0,
               ("tiny-gpt2", "generate"): load, ("tiny-gpt2", "generate c32"): load,
               ("tiny-gpt2", "fibermill c32"): load,
               ("mixed", "fibermill"): bp.Load(1.0, [0.1, 0.5, 0.2, 0.4], budgets),
               ("mixed", "engine"): bp.Load(0.5, [0.05, 0.2, 0.1, 0.2], budgets),
               ("mixed", "generate"): bp.Load(2.0, [0.4] * 4, budgets)}
    text = "\n".join(bp.report(results))
    generate = "| transformers `generate`, batches of 32, in process, best sitting |"
    assert f"{generate} 4 | 2.0 | 250.0 | 16 | - |" in text
    assert "| LitServe, c=32 | - | - | - | - | - |" in text
    assert "| Fibermill c=32 / generate (median of paired rounds) | 1.00x | - |" in text
    # short requests (8 and 16 new tokens) under load: 0.1 s and 0.2 s
    assert "| Fibermill end to end, c=32 | 4.0 | 188 | 150.0 | - | - | - |" in text
    assert "| Fibermill engine, in process, c=32 | 8.0 | 376 | 75.0 | - | - | - |" in text
    assert "The engine in process / static `generate`: 4.00x." in text
    bound = f"{bp.continuous_bound(budgets):.2f}x"
    assert "at equal step time (`continuous_bound`: the last requests decode with few " in text
    assert f"beside them): {bound};" in text
    assert "Not measured: LitServe is not installed" in text


def test_fastest_is_the_highest_requests_per_second():
    slow, fast = bp.Load(4.0, [1.0] * 4), bp.Load(1.0, [0.25] * 4)
    load = bp.fastest([slow, fast])
    assert load.seconds == 1.0 and load.rounds == [1.0, 4.0]
    with pytest.raises(ValueError):
        bp.fastest([])


def test_paired_ratio_is_the_median_of_the_rounds_ratios():
    # Round by round, a is 2x, 1.5x and 4x b; the medians of each side would give 1.0x.
    a = bp.median_round([bp.Load(1.0, [0.1] * n) for n in (4, 6, 16)])
    b = bp.median_round([bp.Load(1.0, [0.1] * n) for n in (2, 4, 4)])
    assert bp.paired_ratio(a, b) == 2.0
    assert bp.paired_ratio(a, None) is None
    # Loads without paired rounds: the ratio of the two.
    assert bp.paired_ratio(bp.Load(1.0, [0.1] * 6), bp.Load(1.0, [0.1] * 3)) == 2.0


def test_report_gives_the_paired_ratio_and_each_rounds():
    fm = bp.median_round([bp.Load(1.0, [0.1] * n, [16] * n) for n in (4, 6, 16)])
    ls = bp.median_round([bp.Load(1.0, [0.1] * n, [16] * n) for n in (2, 4, 4)])
    results = {"sizes": bp.FULL, "errors": [], "mixed_budgets": [8], "seconds": 1.0,
               ("tiny-gpt2", "fibermill c32"): fm, ("tiny-gpt2", "litserve c32"): ls}
    text = "\n".join(bp.report(results))
    assert "| Fibermill c=32 / LitServe c=32 (median of paired rounds) | 2.00x | - |" in text
    assert "| the paired rounds' ratios | 2.00, 1.50, 4.00 | - |" in text
