"""The tracing benchmark's parts: its receiver counts what a real OTLP exporter sends, and its
report states the ratio it measured."""

import statistics
from collections import Counter
from itertools import pairwise

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from benchmarks.trace_cost import (
    AGAIN,
    OWN,
    PLAIN,
    SAMPLED,
    TRACED,
    SpanSink,
    TracedSide,
    _envs,
    balanced_orders,
    median_interval,
    report,
)


def test_the_sink_counts_the_spans_an_exporter_sends():
    sink = SpanSink()
    # A provider of this test's own: the process-wide one stays the no-op tracer.
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=f"{sink.url}/v1/traces")))
    try:
        tracer = provider.get_tracer("test")
        for name in ("a", "b", "c"):
            with tracer.start_as_current_span(name):
                pass
        assert sink.spans == 3
    finally:
        provider.shutdown()
        sink.close()


def test_the_report_states_each_side_and_the_ratios():
    sides = {TRACED: TracedSide("traced", [96.0, 98.0], [0.30, 0.31], [12.0, 12.0],
                                [4.5, 4.7], {"api": [1.5, 1.7], "worker": [2.5, 2.5],
                                             "redis": [0.5, 0.5]}),
             OWN: TracedSide("own", [99.0, 99.0], [0.29, 0.30], [6.0, 6.0], [4.3, 4.3]),
             SAMPLED: TracedSide("sampled", [100.0, 98.0], [0.29, 0.30], [1.0, 1.5],
                                 [4.2, 4.3]),
             PLAIN: TracedSide("not traced", [100.0, 100.0], [0.29, 0.30], [0.0, 0.0],
                               [4.2, 4.2]),
             AGAIN: TracedSide("again", [101.0, 99.0], [0.29, 0.30], [0.0, 0.0], [4.2, 4.2])}
    text = "\n".join(report({"jobs": 40, "rounds": 2, "sides": sides,
                             "ratio": {TRACED: 0.97, OWN: 0.99, SAMPLED: 0.99, AGAIN: 1.0},
                             "ratios": {TRACED: [0.96, 0.98], OWN: [0.99, 0.99],
                                        SAMPLED: [1.0, 0.98], AGAIN: [1.01, 0.99]}}))
    assert "| traced | 97.0 | 95.5-98.5 | 305 | 4.60 | 1.60 / 2.50 / 0.50 | 12.0 |" in text
    assert "| own | 99.0 | 99.0-99.0 | 295 | 4.30 | - | 6.0 |" in text
    assert "traced / not traced: **0.97x**, the median of the 2 rounds' ratios" in text
    assert "(95% interval 0.96-0.98; quartiles 0.9" in text and "rounds: 0.96, 0.98" in text
    assert "the job's spans only / not traced: **0.99x**" in text
    assert "traced, 10% sampled / not traced: **0.99x**" in text
    assert "of a second untraced stack / not traced: **1.00x**" in text


def test_a_report_of_fewer_stacks_states_those_it_measured():
    sides = {k: TracedSide(k, [100.0, 95.0, 97.0], [0.3] * 3, [4.0 if k == TRACED else 0.0] * 3,
                           [4.0] * 3) for k in (TRACED, PLAIN, AGAIN)}
    text = "\n".join(report({"jobs": 40, "rounds": 3, "sides": sides,
                             "ratio": {TRACED: 0.97, AGAIN: 1.0},
                             "ratios": {TRACED: [0.97, 0.96, 0.98], AGAIN: [1.0] * 3}}))
    assert "3 stacks alike" in text and "only / not traced" not in text
    assert "traced / not traced: **0.97x**" in text and "sampled / not traced" not in text


def test_the_median_interval_holds_the_median_and_narrows_with_more_rounds():
    few = [0.9, 1.0, 0.95, 1.05, 0.97]
    low, high = median_interval(few)
    assert low <= statistics.median(few) <= high
    many_low, many_high = median_interval(few * 20)
    assert high - low > many_high - many_low


def test_rounds_of_one_session_are_drawn_together():
    # Three sessions whose stacks came out at their own speeds: drawn round by round, the
    # interval would take their 30 rounds as 30 draws of one speed.
    rounds = [0.9] * 10 + [1.0] * 10 + [1.1] * 10
    low, high = median_interval(rounds, sessions=3)
    round_low, round_high = median_interval(rounds)
    assert low <= 0.95 and high >= 1.05 and high - low > round_high - round_low


def test_the_traced_sides_differ_only_in_the_instrumentations_and_the_sampler():
    sink = SpanSink()
    try:
        envs = _envs(sink)
    finally:
        sink.close()
    assert envs[OWN].pop("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS") == "fastapi"
    assert envs[SAMPLED].pop("OTEL_TRACES_SAMPLER") == "parentbased_traceidratio"
    assert envs[SAMPLED].pop("OTEL_TRACES_SAMPLER_ARG") == "0.1"
    assert envs[OWN] == envs[TRACED] == envs[SAMPLED]
    assert envs[PLAIN] == envs[AGAIN] == {"OTEL_TRACES_EXPORTER": "none"}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_balanced_orders_put_each_stack_in_each_place_and_after_each_other_as_often(n):
    orders = balanced_orders(n)
    assert all(sorted(order) == list(range(n)) for order in orders)
    places = Counter((stack, place) for order in orders for place, stack in enumerate(order))
    assert set(places) == {(s, p) for s in range(n) for p in range(n)}
    assert len(set(places.values())) == 1
    after = Counter(pair for order in orders for pair in pairwise(order))
    assert set(after) == {(a, b) for a in range(n) for b in range(n) if a != b}
    assert len(set(after.values())) <= 1  # none at all for one stack
