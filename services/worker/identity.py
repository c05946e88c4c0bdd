"""Who a worker process is: the id its leases and heartbeat carry."""

import os
import socket
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class WorkerIdentity:
    name: str  # the launcher's slot name (host and device), shared by restarts
    device: str
    pid: int = field(default_factory=os.getpid)
    host: str = field(default_factory=socket.gethostname)
    started_at: float = field(default_factory=time.time)

    @property
    def id(self) -> str:
        """Unique per process: a restarted worker never inherits its predecessor's leases."""
        return f"{self.name}/{self.pid}"
