"""Device memory gauges, read at scrape time: device="cpu" at 0 without CUDA, one series per
initialised GPU (named by the host's GPU id) with it. CUDA is faked here; the CPU path also
runs end to end (tests/e2e/test_metrics.py)."""

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest

from services.worker import device_metrics
from services.worker.device_metrics import (
    ALLOCATED,
    RESERVED,
    DeviceMemoryCollector,
    read_memory,
    register_device_metrics,
)
from tests.promtext import parse, promtool_check


def _page(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: (i + 1) * 1024)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: (i + 1) * 4096)


def test_a_cpu_worker_reports_device_cpu_at_zero(monkeypatch):
    # What a worker without CUDA reports, also when this test runs on a GPU machine.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert read_memory() == [("cpu", 0, 0)]
    registry = CollectorRegistry()
    register_device_metrics(registry)
    samples = parse(_page(registry))
    assert samples[(ALLOCATED, frozenset({("device", "cpu")}))] == 0
    assert samples[(RESERVED, frozenset({("device", "cpu")}))] == 0


def test_gpus_are_read_at_scrape_time_and_named_by_host_id(fake_cuda, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    registry = CollectorRegistry()
    register_device_metrics(registry)
    text = _page(registry)
    samples = parse(text)
    assert samples[(ALLOCATED, frozenset({("device", "cuda:3")}))] == 1024
    assert samples[(ALLOCATED, frozenset({("device", "cuda:5")}))] == 2048
    assert samples[(RESERVED, frozenset({("device", "cuda:5")}))] == 8192
    assert not any(labels == frozenset({("device", "cpu")}) for _, labels in samples)
    promtool_check(text)
    # Read again at the next scrape, not cached.
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: 7)
    assert parse(_page(registry))[(ALLOCATED, frozenset({("device", "cuda:3")}))] == 7


def test_without_visible_devices_torch_indices_name_the_gpus(fake_cuda, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [d for d, _, _ in read_memory()] == ["cuda:0", "cuda:1"]


def test_registering_touches_no_device_and_happens_once(monkeypatch):
    def boom(*_):
        raise AssertionError("the device was read at registration")

    monkeypatch.setattr(device_metrics, "read_memory", boom)
    registry = CollectorRegistry(auto_describe=True)
    register_device_metrics(registry)
    register_device_metrics(registry)  # a second call is a no-op, not a duplicate error
    names = {m.name for c in [DeviceMemoryCollector()] for m in c.describe()}
    assert names == {ALLOCATED, RESERVED}
