"""The engine benchmark's report (no benchmark runs here)."""

from benchmarks import engine as be


def _results(paired: float | None) -> dict:
    r: dict = {"n": 32, "steady": {"clients": 4, "jobs": 10, "image_jobs": 3, "p50": 0.02,
                                   "p99": 0.04, "adhoc": 0, "pooled": 3}}
    for name, on, inproc in (("text", 100.0, 400.0), ("image", 50.0, 100.0),
                             ("digits", 8.0, 10.0)):
        r.update({(name, True): on, (name, "in-process"): inproc,
                  (name, "in-process threads"): 1, (name, True, "batch"): 4.0})
        if paired is not None:
            r[(name, "paired")] = paired
    r[("text", False)] = 50.0
    return r


def test_the_end_to_end_ratio_is_the_paired_one():
    # The rounds' ratios can differ from the ratio of the medians: the paired one is shown.
    text = "\n".join(be.report(_results(paired=0.9)))
    assert "| digits, 16x16, 50 steps | every core | - | 8.0 | 4.0 | - | 10.0 (1) | 0.90x |" in text
    assert "| tiny-gpt2, 16 new tokens | 1 | 50.0 | 100.0 | 4.0 | 2.00x | 400.0 (1) | 0.90x |" \
        in text


def test_without_paired_rounds_the_ratio_is_of_the_medians():
    text = "\n".join(be.report(_results(paired=None)))
    assert "| 10.0 (1) | 0.80x |" in text
