"""The structured-output benchmark's report (no model runs here)."""

from benchmarks import structured_output as so


def test_the_report_gives_each_models_ratio_as_the_median_of_rounds() -> None:
    r = {"rounds": 3, "gpt2-6x256": ([0.001, 0.002, 0.001], [0.0011, 0.0024, 0.0013]),
         "tiny-gpt2": ([0.0001] * 3, [0.0003] * 3)}
    lines = so.report(r)
    assert "| gpt2-6x256 | 1.000 | 1.300 | 1.20x |" in lines
    assert "| tiny-gpt2 | 0.100 | 0.300 | 3.00x |" in lines
