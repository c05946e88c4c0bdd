"""What a batch driver works with (DriverParts: the stores and services it calls, opened once
by the app's lifespan) and its pace (DriverConfig), so that a replica and a test each build one
from their own."""

from dataclasses import dataclass

from services.api.batches.files import FileStore
from services.api.batches.store import BatchStore
from services.api.events import EventHub
from services.api.lifecycle import Lifecycle
from services.api.submission import BatchLines, Submissions
from shared.blobstore.base import BlobStore
from shared.jobstore import JobStore
from shared.registry import ModelRegistry

TICK_SECONDS = 0.5
LEASE_MS = 15_000
MAX_DRIVEN = 32  # batches one replica drives at once; the others wait for a replica
FLUSH_LINES = 512
FLUSH_SECONDS = 10.0


@dataclass(frozen=True)
class DriverParts:
    batches: BatchStore
    files: FileStore
    blobs: BlobStore
    store: JobStore
    # Given the app's Submissions, the driver gets it as BatchLines: its lines queue as batch
    # work (below every interactive job, within the key's share of the model's queue).
    submissions: Submissions | BatchLines
    lifecycle: Lifecycle
    registry: ModelRegistry
    hub: EventHub | None = None  # tells the driver a line's job ended between ticks

    def __post_init__(self) -> None:
        if not isinstance(self.submissions, BatchLines):
            object.__setattr__(self, "submissions", BatchLines(self.submissions))


@dataclass(frozen=True)
class DriverConfig:
    tick_seconds: float = TICK_SECONDS
    lease_ms: int = LEASE_MS  # a replica that stops renewing hands its batches over after it
    max_driven: int = MAX_DRIVEN
    # A batch's finished lines leave Redis for a part in the blob store once this many wait,
    # or the oldest of them waited this long (and when the batch ends).
    flush_lines: int = FLUSH_LINES
    flush_seconds: float = FLUSH_SECONDS


DEFAULT_CONFIG = DriverConfig()
