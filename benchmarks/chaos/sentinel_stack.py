"""The chaos stack with Redis Sentinel: a primary, one replica and three sentinels, each its own
process (services/devstack/redis_sentinel.py), under the same API replicas and workers, which
find the primary through the sentinels.

A failover is only what the sentinels say: the kill that causes one waits until they name
another primary and keeps how long that took, so the report shows each failover the run rode
out rather than the ones it meant to cause. With one replica, every write that must reach a
replica (a job's creation, results, final state) waits from the failover until the killed node
is back as a replica of the new primary; the schedule brings it back well within
FIBERMILL_REDIS_RETRY_SECONDS.
"""

import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.chaos.stack import Stack
from services.devstack.redis_sentinel import Node, SentinelGroup

FAILOVER_TIMEOUT = 60.0  # sentinels not naming a new primary by then: the failover failed
SYNC_TIMEOUT = 60.0  # a node back as a replica that has not synced by then never will


@dataclass(frozen=True)
class Failover:
    old_port: int
    new_port: int
    seconds: float  # from the kill until the sentinels named the new primary


class SentinelStack(Stack):
    def __init__(self, workdir: Path, env: dict[str, str], workers: int = 2) -> None:
        super().__init__(workdir, env, workers)
        self.group = SentinelGroup(workdir / "sentinel")
        self.failovers: list[Failover] = []
        self.down: Node | None = None  # the killed primary, until it is back as a replica
        self.paused: Node | None = None

    def start_redis(self) -> int:
        """The group, once; the services then reach Redis only through its sentinels."""
        if self.group.nodes:
            raise RuntimeError("a Sentinel stack's Redis is started once; faults use the group")
        self.group.start()
        self.env.update(self.group.env())
        return _pid(self.group.primary())

    def primary_port(self) -> int | None:
        return self.group.primary_port()

    def kill_primary(self) -> str:
        """SIGKILL the primary, then wait for the sentinels to promote the replica."""
        if self.down is not None or self.paused is not None:
            raise RuntimeError("no replica to promote: one node is down or paused")
        node = self.group.primary()
        pid = _pid(node)
        started = time.monotonic()
        self.group.kill(node)
        self.down = node
        new_port = self.group.wait_failover(node.port, FAILOVER_TIMEOUT)
        took = time.monotonic() - started
        self.failovers.append(Failover(node.port, new_port, took))
        return (f"{node.name} :{node.port} pid {pid}; the sentinels named :{new_port} "
                f"after {took:.1f} s")

    def restart_old_primary(self) -> str:
        """The killed node back on its data, as a replica of the new primary, synced."""
        node = self.down
        if node is None:
            raise RuntimeError("no killed primary to bring back")
        started = time.monotonic()
        self.group.restart_as_replica(node)
        self.down = None
        self.group.wait_synced(node, SYNC_TIMEOUT)
        return (f"{node.name} :{node.port} pid {_pid(node)}, synced with the primary after "
                f"{time.monotonic() - started:.1f} s")

    def pause_replica(self) -> str:
        if self.down is not None:
            # The only replica left is the new primary's partner-to-be: none to pause, and
            # pausing the primary instead would stop every write rather than delay them.
            raise RuntimeError("the replica is the new primary while the old one is down")
        primary = self.group.primary_port()
        node = next(n for n in self.group.nodes if n.port != primary)
        self.group.pause(node)
        self.paused = node
        return f"{node.name} :{node.port} pid {_pid(node)}"

    def resume_replica(self) -> str:
        node = self.paused
        if node is None:
            raise RuntimeError("no paused replica")
        self.group.resume(node)
        self.paused = None
        return f"{node.name} :{node.port} pid {_pid(node)}"

    def kill_sentinel(self, i: int) -> str:
        watcher = self.group.watchers[i]
        pid = _pid(watcher)
        self.group.kill_sentinel(watcher)
        return f"sentinel{i} :{watcher.port} pid {pid}"

    def restart_sentinel(self, i: int) -> str:
        watcher = self.group.watchers[i]
        self.group.restart_sentinel(watcher)
        return f"sentinel{i} :{watcher.port} pid {_pid(watcher)}"

    def log_files(self) -> list[Path]:
        return [*super().log_files(), *sorted(self.group.workdir.glob("*/*.log"))]

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.group.stop()


def _pid(node: Node) -> int:
    if node.pid is None:
        raise RuntimeError(f"{node.name} is not running")
    return node.pid
