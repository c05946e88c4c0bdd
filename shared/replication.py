"""Writes that wait for Redis replicas (WAIT): what one got, and the count of those that did
not reach enough replicas in time, by script. Replication is asynchronous: without the wait, a
replica promoted by a failover lacks the writes it was not yet sent, and a job acknowledged to
its client would be gone."""

import logging
from dataclasses import dataclass

from prometheus_client import Counter

log = logging.getLogger(__name__)

UNREPLICATED = Counter(
    "fibermill_redis_unreplicated_writes",
    "Writes that make a job (creation, result, final state) acknowledged by fewer replicas "
    "than FIBERMILL_REDIS_MIN_REPLICAS within FIBERMILL_REDIS_REPLICA_TIMEOUT_MS",
    ["script"],
)


@dataclass(frozen=True)
class Replication:
    """How many replicas acknowledged a write (`acked`) of the `wanted` it waited
    `timeout_ms` for."""

    acked: int
    wanted: int
    timeout_ms: int

    @property
    def short(self) -> bool:
        return self.acked < self.wanted


NOT_ASKED = Replication(0, 0, 0)


def note(rep: Replication, script: str) -> None:
    """Count and log a write that reached too few replicas."""
    if rep.short:
        UNREPLICATED.labels(script).inc()
        log.warning("redis write %s reached %d of %d replicas within %d ms", script,
                    rep.acked, rep.wanted, rep.timeout_ms)
