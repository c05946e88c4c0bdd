"""Fibermill's own spans (shared/span_recorder.py, through shared/tracing.py's helpers) reach
the span processors as the SDK's would: under their parent, sampled as the provider's sampler
says, encoded by the OTLP exporter's own encoder in one group with the SDK's spans. A provider
of the test's own, never the process's global one."""

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    TraceIdRatioBased,
)
from opentelemetry.trace import StatusCode

from shared import tracing

SAMPLED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
NOT_SAMPLED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"


def test_a_recorded_span_is_the_child_of_its_traceparent_with_its_times(exported):
    exporter, _ = exported
    ctx = tracing.record("fibermill.queue", SAMPLED, 100.0, 100.25, {"fibermill.index": 3})
    (span,) = exporter.get_finished_spans()
    assert ctx == span.context and span.name == "fibermill.queue"
    assert f"{span.context.trace_id:032x}" == tracing.trace_id(SAMPLED)
    assert span.parent is not None and f"{span.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert span.parent.is_remote and not span.context.is_remote
    assert (span.start_time, span.end_time) == (100_000_000_000, 100_250_000_000)
    assert span.attributes == {"fibermill.index": 3}


def test_an_open_span_parents_others_before_it_ends(exported):
    exporter, _ = exported
    lease = tracing.start("fibermill.lease", SAMPLED, 10.0, {"fibermill.index": 0})
    assert lease is not None and exporter.get_finished_spans() == ()  # exported at its end
    batch = tracing.record("fibermill.batch", lease, 10.5, 11.0, links=[tracing.link_to(lease)])
    lease.set_status(StatusCode.ERROR, "failed")
    tracing.end(lease, 12.0, {"fibermill.outcome": "failed"})
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["fibermill.batch"].parent == lease.context and batch is not None
    assert [link.context for link in spans["fibermill.batch"].links] == [lease.context]
    done = spans["fibermill.lease"]
    assert done.attributes == {"fibermill.index": 0, "fibermill.outcome": "failed"}
    assert done.status.status_code == StatusCode.ERROR and done.end_time == 12_000_000_000


def test_a_parent_not_sampled_makes_its_children_unsampled_and_unexported(exported):
    exporter, _ = exported
    ctx = tracing.record("fibermill.queue", NOT_SAMPLED, 1.0, 2.0)
    assert ctx is not None and not ctx.trace_flags.sampled
    child = tracing.record("fibermill.device", ctx, 1.0, 2.0)
    assert child is not None and not child.trace_flags.sampled
    assert tracing.link_to(ctx) is None  # nothing to link to: it was never exported
    assert exporter.get_finished_spans() == ()


def test_a_root_asks_the_providers_sampler(exported):
    exporter, install = exported
    install(ParentBased(TraceIdRatioBased(0.0)))
    with tracing.span("fibermill.submit") as root:
        assert root is not None and not root.context.trace_flags.sampled
        assert tracing.current_traceparent() == tracing.traceparent_of(root)
    # ...and a parent's flag decides for its children under a parent-based sampler.
    assert tracing.record("fibermill.queue", SAMPLED, 1.0, 2.0) is not None
    install(ALWAYS_OFF)  # not parent-based: the sampler decides for children too
    assert not tracing.record("fibermill.queue", SAMPLED, 1.0, 2.0).trace_flags.sampled
    assert [s.name for s in exporter.get_finished_spans()] == ["fibermill.queue"]


class _Asked(ALWAYS_ON.__class__):
    """Samples all, keeping the attributes it was asked with."""

    def __init__(self) -> None:
        super().__init__(Decision.RECORD_AND_SAMPLE)
        self.asked: list[dict] = []

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None,
                      links=None, trace_state=None):
        self.asked.append(dict(attributes or {}))
        return super().should_sample(parent_context, trace_id, name, kind, attributes, links,
                                     trace_state)


def test_a_sampler_is_asked_with_a_server_spans_shared_attributes_too(exported):
    exporter, install = exported
    sampler = _Asked()
    install(sampler)
    with tracing.request("GET", None, {"url.path": "/v1/jobs/a"},
                         (("http.request.method", "GET"), ("server.port", 8000))):
        pass
    assert sampler.asked == [{"http.request.method": "GET", "server.port": 8000,
                              "url.path": "/v1/jobs/a"}]
    (span,) = exporter.get_finished_spans()
    assert dict(span.attributes) == sampler.asked[0]


def test_the_default_samplers_roots_are_sampled(exported):
    exporter, install = exported
    install(ParentBased(ALWAYS_ON))  # as the SDK makes it from no OTEL_TRACES_SAMPLER
    with tracing.span("fibermill.submit") as root:
        assert root is not None and root.parent is None
        assert root.context.trace_flags.sampled and not root.context.trace_state
    assert [s.name for s in exporter.get_finished_spans()] == ["fibermill.submit"]


def test_the_current_span_parents_a_span_block_and_an_exception_marks_it(exported):
    exporter, _ = exported
    with (tracing.continued(SAMPLED), pytest.raises(KeyError),
          tracing.span("fibermill.submit", attributes={"fibermill.model": "m"}) as s):
        assert s is not None
        s.set_attributes({"fibermill.outputs": 2})
        raise KeyError("nope")
    (span,) = exporter.get_finished_spans()
    assert f"{span.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert span.attributes == {"fibermill.model": "m", "fibermill.outputs": 2}
    assert span.status.status_code == StatusCode.ERROR and "KeyError" in span.status.description


def test_a_leaders_links_stop_at_the_sdks_link_limit(exported, monkeypatch):
    exporter, install = exported
    monkeypatch.setenv("OTEL_SPAN_LINK_COUNT_LIMIT", "3")
    install()
    peers = [tracing.record("fibermill.lease", SAMPLED, 1.0, 2.0) for _ in range(5)]
    tracing.record("fibermill.batch", SAMPLED, 1.0, 2.0,
                   links=[tracing.link_to(p) for p in peers])
    (batch,) = [s for s in exporter.get_finished_spans() if s.name == "fibermill.batch"]
    assert [link.context for link in batch.links] == peers[:3]


def test_they_encode_as_otlp_in_one_group_with_the_sdks_spans(exported):
    exporter, install = exported
    provider = install()
    with (provider.get_tracer("fastapi").start_as_current_span("POST /v1/jobs"),
          tracing.span("fibermill.submit")):
        pass
    request = encode_spans(exporter.get_finished_spans())
    (group,) = request.resource_spans  # one resource, though two objects carry it
    assert {a.key: a.value.string_value for a in group.resource.attributes}["service.name"] \
        == "test"
    by_name = {s.name: s for scope in group.scope_spans for s in scope.spans}
    assert by_name["fibermill.submit"].parent_span_id == by_name["POST /v1/jobs"].span_id
    assert {scope.scope.name for scope in group.scope_spans} == {"fastapi", "fibermill"}


def test_a_requests_first_job_takes_its_server_span_and_others_have_their_own(exported):
    exporter, _ = exported
    with tracing.request("POST", None, {"url.path": "/v1/jobs"}) as server:
        with tracing.submitted("fibermill.submit", {"fibermill.model": "a"}) as first:
            assert first is server and server is not None
            assert tracing.current_traceparent() == tracing.traceparent_of(server)
            first.set_attributes({"fibermill.job_id": "j1"})
        with tracing.submitted("fibermill.submit", {"fibermill.model": "b"}) as second:
            assert second is not None and second is not server
            second.set_attributes({"fibermill.job_id": "j2"})
    with tracing.submitted("fibermill.submit", {"fibermill.model": "c"}) as alone:
        assert alone is not None and alone.parent is None  # no request: a root of its own
    spans = {s.attributes.get("fibermill.model"): s for s in exporter.get_finished_spans()}
    assert spans["a"].name == "POST" and spans["a"].kind.name == "SERVER"
    assert spans["a"].attributes["fibermill.job_id"] == "j1"
    assert spans["b"].name == "fibermill.submit" and spans["b"].parent == spans["a"].context
    assert spans["c"].name == "fibermill.submit"


def test_a_refused_submit_leaves_its_request_span_without_a_job(exported):
    exporter, _ = exported
    with (tracing.request("POST", None, {}), pytest.raises(ValueError),
          tracing.submitted("fibermill.submit", {"fibermill.model": "a"})):
        raise ValueError("422")
    (span,) = exporter.get_finished_spans()
    assert span.attributes == {"fibermill.model": "a"}
