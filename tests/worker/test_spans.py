"""A sub-request's spans on its worker (services/worker/spans.py), recorded into memory: their
tree under the job's traceparent, and a batch's links, which grow with the batch, not with its
square."""

import time

from services.worker.spans import SubRequestSpans, linked
from shared import tracing
from shared.messages import Outcome, SubRequest, TextItem


def _sub(n: int) -> SubRequest:
    return SubRequest(job_id=f"job{n}", index=0, model="tiny-gpt2",
                      item=TextItem(prompt="Hello", max_new_tokens=4),
                      traceparent=f"00-{n:032x}-{n:016x}-01", sent_at=time.time() - 0.01)


def test_the_leader_links_to_every_other_and_each_other_to_the_leader():
    together = ["a:0", "b:0", "c:0"]
    assert linked("a:0", together) == ["b:0", "c:0"]
    assert linked("c:0", together) == ["a:0"] and linked("a:0", []) == []


def test_a_batch_of_n_makes_three_spans_each_and_two_n_minus_one_links(exported):
    exporter, _ = exported
    subs = [_sub(n) for n in range(1, 6)]
    spans = {s.member: SubRequestSpans.open(s, "worker-1") for s in subs}
    members = [s.member for s in subs]
    for member, sp in spans.items():
        assert sp is not None
        sp.started_with([spans[m] for m in linked(member, members)])
    now = time.time()
    for sp in spans.values():
        sp.ran(now - 0.02, now - 0.01, now, len(subs), 4)
        sp.stored(now, now + 0.001, True)
        sp.close(Outcome.SUCCEEDED, 1)
    done = exporter.get_finished_spans()
    names = [s.name for s in done]
    for name in ("fibermill.queue", "fibermill.lease", "fibermill.batch"):
        assert names.count(name) == len(subs), name
    leases = {s.context.span_id: s for s in done if s.name == "fibermill.lease"}
    batches = [s for s in done if s.name == "fibermill.batch"]
    assert len(done) == 3 * len(subs)
    assert sum(len(b.links) for b in batches) == 2 * (len(subs) - 1)
    for b in batches:
        assert b.parent.span_id in leases and b.attributes["fibermill.batch.size"] == 5
        assert b.attributes["fibermill.steps"] == 4
        assert all(link.context.span_id in leases for link in b.links)
    for lease in leases.values():  # each under its own job's submit span
        assert f"{lease.parent.span_id:016x}" == f"{lease.context.trace_id:016x}"
        assert lease.attributes["fibermill.job_final"] is True
        assert lease.attributes["fibermill.outcome"] == "succeeded"


def test_nothing_is_made_for_a_sub_request_stored_without_a_trace(exported):
    exporter, _ = exported
    assert SubRequestSpans.open(_sub(1).model_copy(update={"traceparent": None}), "w") is None
    assert exporter.get_finished_spans() == ()
    assert tracing.enabled()


def test_a_job_not_sampled_makes_nothing_unless_the_sampler_ignores_the_parent(exported):
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    exporter, install = exported
    unsampled = _sub(7).model_copy(update={"traceparent": f"00-{7:032x}-{7:016x}-00"})
    assert SubRequestSpans.open(unsampled, "worker-1") is None  # parent-based: the default
    install(ALWAYS_ON)  # a sampler of its own for every span: the parent's flag is not enough
    spans = SubRequestSpans.open(unsampled, "worker-1")
    assert spans is not None
    spans.close(Outcome.SUCCEEDED, 1)
    assert {s.name for s in exporter.get_finished_spans()} == {"fibermill.queue",
                                                               "fibermill.lease"}
