"""A local Redis with Sentinel: a primary, replicas and sentinels, each a process of its own on
127.0.0.1, for the tests and the chaos run's failover schedule (benchmarks/chaos).

The sentinels agree on a failure after `down_after_ms` without an answer (a quorum of 2) and
promote a replica; a node killed and started again comes back as a replica of whichever node
is the primary then. Each node keeps its own data dir, append-only file and log.
"""

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from services.devstack.redis_server import find_redis_server, free_ports, start_redis

MASTER = "fibermill"
QUORUM = 2


@dataclass
class Node:
    name: str
    port: int
    workdir: Path
    proc: subprocess.Popen | None = None
    paused: bool = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None


@dataclass
class SentinelGroup:
    workdir: Path
    replicas: int = 1
    sentinels: int = 3
    down_after_ms: int = 1000
    failover_timeout_ms: int = 4000
    master: str = MASTER
    nodes: list[Node] = field(default_factory=list)
    watchers: list[Node] = field(default_factory=list)  # the sentinels

    @property
    def sentinel_addresses(self) -> str:
        """FIBERMILL_REDIS_SENTINELS of this group."""
        return ",".join(f"127.0.0.1:{s.port}" for s in self.watchers)

    def env(self) -> dict[str, str]:
        return {"FIBERMILL_REDIS_SENTINELS": self.sentinel_addresses,
                "FIBERMILL_REDIS_SENTINEL_MASTER": self.master,
                "FIBERMILL_REDIS_URL": "redis://127.0.0.1/0"}

    def start(self) -> None:
        """Start the nodes and the sentinels; all stopped again if one does not come up."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        # One block of ports for the nodes: ports drawn one by one could come out the same
        # (each free when drawn), and a node that cannot bind its port exits while another
        # answers there.
        first = free_ports(1 + self.replicas)
        for i in range(1 + self.replicas):
            node = Node(f"redis{i}", first + i, self.workdir / f"redis{i}")
            self.nodes.append(node)
        primary = self.nodes[0]
        self._start_node(primary, replica_of=None)
        for node in self.nodes[1:]:
            self._start_node(node, replica_of=primary.port)
        for node in self.nodes[1:]:
            self.wait_synced(node)
        first = free_ports(self.sentinels)  # the nodes bound theirs: none of these
        for i in range(self.sentinels):
            watcher = Node(f"sentinel{i}", first + i, self.workdir / f"sentinel{i}")
            self.watchers.append(watcher)
            self._start_sentinel(watcher, primary.port)
        self.wait_agreed(primary.port)

    def _start_node(self, node: Node, replica_of: int | None) -> None:
        args = ["--logfile", str((node.workdir / "redis.log").resolve()),
                # a replica that lost its primary still answers reads, and the sentinels'
                # choice among replicas is by this priority, then by offset
                "--replica-priority", "100"]
        if replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(replica_of)]
        node.workdir.mkdir(parents=True, exist_ok=True)
        node.proc = start_redis(node.port, node.workdir, args=args)
        node.paused = False

    def _start_sentinel(self, watcher: Node, primary_port: int) -> None:
        watcher.workdir.mkdir(parents=True, exist_ok=True)
        conf = watcher.workdir / "sentinel.conf"
        if not conf.exists():  # a sentinel rewrites its file with what it learned: keep it
            conf.write_text("\n".join([
                f"port {watcher.port}", "bind 127.0.0.1", f"dir {watcher.workdir.resolve()}",
                f"logfile {(watcher.workdir / 'sentinel.log').resolve()}",
                f"sentinel monitor {self.master} 127.0.0.1 {primary_port} {QUORUM}",
                f"sentinel down-after-milliseconds {self.master} {self.down_after_ms}",
                f"sentinel failover-timeout {self.master} {self.failover_timeout_ms}",
                f"sentinel parallel-syncs {self.master} 1", ""]))
        watcher.proc = subprocess.Popen([find_redis_server(), str(conf), "--sentinel"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        _wait_ping(watcher.port, watcher.proc)

    # What the sentinels say ------------------------------------------------------------------

    def primary_port(self) -> int | None:
        """The primary's port as most answering sentinels name it."""
        votes: dict[int, int] = {}
        for watcher in self.watchers:
            if watcher.proc is None or watcher.paused or watcher.proc.poll() is not None:
                continue
            try:
                with redis.Redis(port=watcher.port, socket_timeout=1) as client:
                    addr = client.execute_command("SENTINEL", "get-master-addr-by-name",
                                                  self.master)
            except (redis.RedisError, OSError):
                continue
            if addr:
                port = int(addr[1])
                votes[port] = votes.get(port, 0) + 1
        return max(votes, key=lambda p: votes[p]) if votes else None

    def primary(self) -> Node:
        port = self.primary_port()
        return next(n for n in self.nodes if n.port == port)

    def wait_agreed(self, port: int, timeout: float = 30.0) -> None:
        """Until every live sentinel names `port` as the primary and knows the replicas."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self._names(w, port) for w in self.watchers
                   if w.proc is not None and w.proc.poll() is None and not w.paused):
                return
            time.sleep(0.1)
        raise TimeoutError(f"the sentinels did not agree on 127.0.0.1:{port} in {timeout} s")

    def _names(self, watcher: Node, port: int) -> bool:
        try:
            with redis.Redis(port=watcher.port, socket_timeout=1) as client:
                addr = client.execute_command("SENTINEL", "get-master-addr-by-name",
                                              self.master)
                info = client.execute_command("SENTINEL", "master", self.master)
        except (redis.RedisError, OSError):
            return False
        fields = dict(zip(info[::2], info[1::2], strict=False)) if isinstance(info, list) \
            else info
        replicas = int(fields.get(b"num-slaves", fields.get("num-slaves")) or 0)
        return bool(addr) and int(addr[1]) == port and replicas >= 1

    def wait_failover(self, old_port: int, timeout: float = 30.0) -> int:
        """Until the sentinels name a primary other than `old_port`: its port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self.primary_port()
            if port is not None and port != old_port:
                return port
            time.sleep(0.1)
        raise TimeoutError(f"no failover from 127.0.0.1:{old_port} in {timeout} s")

    def wait_synced(self, node: Node, timeout: float = 30.0) -> None:
        """Until `node` is a replica whose link to its primary is up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with redis.Redis(port=node.port, socket_timeout=1) as client:
                    info = client.info("replication")
                if info.get("role") == "slave" and info.get("master_link_status") == "up":
                    return
            except (redis.RedisError, OSError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{node.name} did not sync with its primary in {timeout} s")

    # Faults ------------------------------------------------------------------------------------

    def kill(self, node: Node) -> None:
        if node.proc is not None:
            node.proc.kill()
            node.proc.wait()
            node.proc = None

    def restart_as_replica(self, node: Node) -> None:
        """A killed node back on its port and data, as a replica of the primary now."""
        port = self.primary_port()
        assert port is not None and port != node.port, "no other primary to follow"
        self._start_node(node, replica_of=port)

    def pause(self, node: Node) -> None:
        if node.proc is not None and not node.paused:
            os.kill(node.proc.pid, signal.SIGSTOP)
            node.paused = True

    def resume(self, node: Node) -> None:
        if node.proc is not None and node.paused:
            os.kill(node.proc.pid, signal.SIGCONT)
            node.paused = False

    def kill_sentinel(self, watcher: Node) -> None:
        self.kill(watcher)

    def restart_sentinel(self, watcher: Node) -> None:
        self._start_sentinel(watcher, self.primary_port() or self.nodes[0].port)

    def stop(self) -> None:
        for node in [*self.watchers, *self.nodes]:
            if node.proc is None:
                continue
            self.resume(node)
            node.proc.terminate()
            try:
                node.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait()
            node.proc = None


def _wait_ping(port: int, proc: subprocess.Popen, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    with redis.Redis(port=port, socket_timeout=1) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"sentinel on port {port} exited with {proc.returncode}")
            try:
                client.ping()
                return
            except (redis.RedisError, OSError):
                time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"sentinel on port {port} did not answer within {timeout} s")
