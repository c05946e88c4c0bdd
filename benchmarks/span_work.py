"""The CPU a trace costs, measured in one process where nothing else moves it.

    python -m benchmarks.span_work

benchmarks/trace_cost.py measures jobs/s, which at tiny-gpt2's ~400 jobs/s on two cores moves
by a fifth from one burst to the next as batches form; this measures the work itself:

- the worker: a batch of 32 traced sub-requests' spans made as the handler makes them
  (services/worker/spans.py: queue, lease, batch with its links), each written as OTLP bytes
  at its end and joined into export requests as the OTLP/HTTP export does
  (shared/span_export.py); in us per sub-request;
- the HTTP server span: a `POST` through an app of one route that submits a job as the API
  does (tracing.submitted), with no spans, with Fibermill's (services/api/server_spans.py: the
  job's submit takes the request's span), and with FastAPI's OpenTelemetry instrumentation in
  its place (its spans encoded by the OTLP exporter's own encoder, the submit a span of its
  own); the CPU of a request, in us;
- the API with the server spans off: a job's own submit span made and encoded; in us per job.

Each is the median of 5 runs of a few thousand.
"""

import asyncio
import statistics
import time
from collections.abc import Callable, MutableMapping
from typing import Any

from fastapi import FastAPI
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from services.api.server_spans import ServerSpans
from services.worker.spans import SubRequestSpans, linked
from shared import otlp_wire, tracing
from shared.messages import Outcome, SubRequest, TextItem

BATCH = 32
EXPORT_BATCH = 512  # the batch processor's OTEL_BSP_MAX_EXPORT_BATCH_SIZE default


class _Encoded:
    """Takes spans as the OTLP/HTTP export does (shared/span_export.py: each written as wire
    bytes as it ends), and `encode` joins them into export requests as its batch processor's
    thread would; nothing is sent."""

    def __init__(self, resource: Resource) -> None:
        self.held: list[bytes] = []
        self.resource = resource

    def emit(self, encoded: bytes) -> None:
        self.held.append(encoded)

    def encode(self) -> None:
        scope = InstrumentationScope("fibermill")
        for i in range(0, len(self.held), EXPORT_BATCH):
            otlp_wire.request(self.resource, scope, self.held[i:i + EXPORT_BATCH])
        self.held.clear()


class _SdkEncoded(SpanExporter):
    """Encodes the SDK's spans as the OTLP exporter does, and keeps nothing."""

    def __init__(self) -> None:
        self.held: list[ReadableSpan] = []

    def export(self, spans) -> SpanExportResult:
        self.held.extend(spans)
        return SpanExportResult.SUCCESS

    def encode(self) -> None:
        for i in range(0, len(self.held), EXPORT_BATCH):
            encode_spans(self.held[i:i + EXPORT_BATCH]).SerializeToString()
        self.held.clear()


def _provider(service: str) -> tuple[TracerProvider, _Encoded]:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    wire = _Encoded(provider.resource)
    tracing.install(provider, [], wire)
    return provider, wire


def _sub(n: int) -> SubRequest:
    return SubRequest(job_id=f"{n:032x}", index=0, model="tiny-gpt2",
                      item=TextItem(prompt="Hello", max_new_tokens=4),
                      traceparent=f"00-{n:032x}-{n:016x}-01", sent_at=time.time())


def _median_us(run: Callable[[], float], times: int = 5) -> float:
    return statistics.median(run() for _ in range(times))


def worker_us(batches: int = 60) -> float:
    """Make and encode the spans of `batches` batches of 32; us per sub-request."""
    _, exporter = _provider("fibermill-worker")
    subs = [_sub(n + 1) for n in range(BATCH * batches)]

    def run() -> float:
        t0 = time.process_time()
        for b in range(batches):
            batch = subs[b * BATCH:(b + 1) * BATCH]
            spans = {s.member: SubRequestSpans.open(s, "worker-1") for s in batch}
            members = [s.member for s in batch]
            for member, sp in spans.items():
                assert sp is not None
                sp.started_with([p for m in linked(member, members)
                                 if (p := spans[m]) is not None])
            now = time.time()
            for sp in spans.values():
                assert sp is not None
                sp.ran(now - 0.005, now - 0.004, now, BATCH, 4)
                sp.stored(now, now + 0.0002, True)
                sp.close(Outcome.SUCCEEDED, 1)
        exporter.encode()
        return (time.process_time() - t0) / len(subs) * 1e6

    return _median_us(run)


def submit_us(jobs: int = 2000) -> float:
    """Make and encode a job's submit span of its own, as with the server spans off (a root:
    no caller's traceparent); us per job."""
    _, exporter = _provider("fibermill-api")

    def run() -> float:
        t0 = time.process_time()
        for n in range(jobs):
            with tracing.span("fibermill.submit", attributes={"fibermill.model": "m"}) as s:
                assert s is not None
                tracing.current_traceparent()
                s.set_attributes({"fibermill.job_id": f"{n:032x}", "fibermill.outputs": 1,
                                  "fibermill.created": True})
        exporter.encode()
        return (time.process_time() - t0) / jobs * 1e6

    return _median_us(run)


def server_us(spans: str, requests: int = 3000) -> float:
    """The CPU of a `POST` through an app of one route, its server spans made by `spans`
    (none, fibermill, instrumentation) and encoded as exported; us per request."""
    app = FastAPI()

    @app.post("/v1/jobs")
    async def create(body: dict) -> dict:
        # As Submissions.submit: the job's submit takes the request's span, or makes its own.
        with tracing.submitted("fibermill.submit", {"fibermill.model": "m"}) as s:
            if s is not None:
                s.set_attributes({"fibermill.job_id": "f" * 32, "fibermill.outputs": 1,
                                  "fibermill.created": True})
        return {"id": "job"}

    exporter: _Encoded | _SdkEncoded | None = None
    sdk = None
    _off()
    if spans != "none":
        provider, exporter = _provider("fibermill-api")
    if spans == "fibermill":
        app.add_middleware(ServerSpans)
    elif spans == "instrumentation":
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        # Its spans encoded by the OTLP exporter's own encoder, as the SDK's spans are.
        sdk = _SdkEncoded()
        provider.add_span_processor(SimpleSpanProcessor(sdk))
        FastAPIInstrumentor.instrument_app(app, tracer_provider=provider,
                                           exclude_spans=["receive", "send"])
    body = b'{"task": "text-generation", "model": "tiny-gpt2", "input": {"prompts": ["A"]}}'
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/jobs", "raw_path": b"/v1/jobs",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000),
             "server": ("127.0.0.1", 8000),
             "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode()),
                         (b"user-agent", b"python-aiohttp")]}

    async def one() -> None:
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> MutableMapping[str, Any]:
            return messages.pop() if messages else {"type": "http.disconnect"}

        async def send(_message: MutableMapping[str, Any]) -> None:
            pass

        await app(dict(scope), receive, send)

    async def many() -> float:
        t0 = time.process_time()
        for _ in range(requests):
            await one()
        for encoded in (exporter, sdk):
            if encoded is not None:
                encoded.encode()
        return (time.process_time() - t0) / requests * 1e6

    asyncio.run(many())  # warm-up
    return _median_us(lambda: asyncio.run(many()))


def run(batches: int = 60, jobs: int = 2000, requests: int = 3000) -> dict[str, float]:
    """Each figure; tracing is off again in this process afterwards."""
    try:
        return {"worker": worker_us(batches), "submit": submit_us(jobs),
                **{f"server_{spans}": server_us(spans, requests)
                   for spans in ("none", "fibermill", "instrumentation")}}
    finally:
        _off()


def _off() -> None:
    """Tracing off in this process (once on, a process's tracing otherwise stays on)."""
    tracing._recorder = None
    tracing._on = False


def report(r: dict[str, float]) -> list[str]:
    return [
        "The work itself (benchmarks/span_work.py, one process, the median of 5 runs): a "
        f"sub-request's worker spans made and encoded for export **{r['worker']:.0f} us** "
        f"(batches of {BATCH}); a request's server span, which its job's submit takes, "
        f"**{r['server_fibermill'] - r['server_none']:.0f} us** "
        f"(services/api/server_spans.py), where FastAPI's OpenTelemetry instrumentation and "
        f"a submit span of its own took "
        f"**{r['server_instrumentation'] - r['server_none']:.0f} us** "
        f"({r['server_none']:.0f} us a `POST` through an app of one route without either); "
        f"a job's submit span of its own (the server spans off) **{r['submit']:.0f} us**.",
    ]


def main() -> None:
    print("\n".join(report(run())))


if __name__ == "__main__":
    main()
