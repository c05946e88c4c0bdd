"""Tracing on inside one test, its spans kept in memory: a provider of the test's own, put
behind shared/tracing.py's helpers, never the process's global one (once set, that stays)."""

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared import tracing


@pytest.fixture
def exported(monkeypatch):
    """Yields (the exporter, `install(sampler=None)`, which puts in a provider with another
    sampler and returns it)."""
    exporter = InMemorySpanExporter()
    # Off again after the test, as it was before it.
    monkeypatch.setattr(tracing, "_recorder", None)
    monkeypatch.setattr(tracing, "_on", False)

    def install(sampler=None):
        provider = TracerProvider(resource=Resource.create({"service.name": "test"}),
                                  **({} if sampler is None else {"sampler": sampler}))
        processor = SimpleSpanProcessor(exporter)
        provider.add_span_processor(processor)
        tracing.install(provider, [processor])
        return provider

    install()
    return exporter, install
