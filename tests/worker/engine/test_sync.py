"""The device-sync helper: copies into the host buffer it is given and counts by reason."""

import torch

from services.worker import metrics
from services.worker.engine import sync


def test_to_host_copies_into_the_staging_buffer_and_counts():
    staging = sync.pinned((2, 3), torch.float32, torch.device("cpu"))
    before = sync.count("sync-test", "output")
    src = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    out = sync.to_host(src, staging, "sync-test")
    assert out is staging and torch.equal(out, src)
    assert sync.count("sync-test", "output") == before + 1
    assert metrics.DEVICE_SYNCS.labels("sync-test", "output")._value.get() == before + 1


def test_counts_are_kept_by_model_and_reason():
    assert sync.read_flag(torch.tensor(True), "sync-flags", "poll") is True
    assert sync.read_flag(torch.tensor(False), "sync-flags", "poll") is False
    staging = torch.empty(1)
    sync.to_host(torch.ones(1), staging, "sync-flags")
    assert sync.count("sync-flags", "poll") == 2
    assert sync.count("sync-flags", "output") == 1
    assert sync.count("sync-flags") == 3
    assert sync.count("sync-other") == 0


def test_host_buffers_are_pinned_only_for_cuda():
    assert not sync.pinned((4,), torch.uint8, torch.device("cpu")).is_pinned()
