"""The fault schedule of a chaos run, and the thread that plays it against the stack.

A schedule is plain data (when, what), so a profile can be read, printed and tested without a
stack; every step that ran is logged with its time, and a step that raised is logged as such
(and fails the run) rather than silently leaving a fault out.
"""

import threading
import time
from dataclasses import dataclass

from benchmarks.chaos.sentinel_stack import SentinelStack
from benchmarks.chaos.stack import Stack

API_BACK_TIMEOUT = 120.0  # a restarted replica not answering by then never came back

# What each step does to the stack; a step's `arg` is the API replica for the API steps.
ACTIONS = {
    "kill_worker": "SIGKILL a worker process (the launcher restarts it)",
    "kill_api": "SIGKILL API replica",
    "start_api": "start API replica",
    "kill_redis": "SIGKILL Redis",
    "start_redis": "start Redis on its AOF",
    "pause_redis": "SIGSTOP Redis",
    "resume_redis": "SIGCONT Redis",
    # A Sentinel stack's (sentinel_stack.py); `arg` is the sentinel for the sentinel steps.
    "kill_primary": "SIGKILL the Redis primary, then wait for the sentinels' failover",
    "restart_old_primary": "restart the killed primary as a replica of the new one",
    "pause_replica": "SIGSTOP the Redis replica",
    "resume_replica": "SIGCONT the Redis replica",
    "kill_sentinel": "SIGKILL sentinel",
    "restart_sentinel": "restart sentinel",
}
# Every kind of fault the issue asks for, as the steps that make one; a run missing one
# injected fewer faults than it claims.
KINDS = {
    "worker SIGKILL": ("kill_worker",),
    "API SIGKILL + restart": ("kill_api", "start_api"),
    "Redis SIGKILL + AOF restart": ("kill_redis", "start_redis"),
    "Redis SIGSTOP/SIGCONT": ("pause_redis", "resume_redis"),
    "API restart while Redis is down": ("kill_api", "start_api"),
}
# The failover profiles' kinds; each kill_primary step must also show a failover the
# sentinels made (FaultRunner.missing_kinds).
FAILOVER_KINDS = {
    "worker SIGKILL": ("kill_worker",),
    "API SIGKILL + restart": ("kill_api", "start_api"),
    "primary SIGKILL + failover": ("kill_primary",),
    "old primary back as a replica": ("restart_old_primary",),
    "replica SIGSTOP/SIGCONT": ("pause_replica", "resume_replica"),
    "sentinel SIGKILL + restart": ("kill_sentinel", "restart_sentinel"),
}


@dataclass(frozen=True)
class Step:
    at: float  # seconds after the chaos phase starts
    action: str
    arg: int | None = None
    note: str = ""

    @property
    def replica(self) -> int:
        """The API replica an API step acts on."""
        if self.arg is None:
            raise ValueError(f"{self.action} names no API replica")
        return self.arg

    @property
    def sentinel(self) -> int:
        """The sentinel a sentinel step acts on."""
        if self.arg is None:
            raise ValueError(f"{self.action} names no sentinel")
        return self.arg


def _each_heavy_fault(api: float, api_back: float, redis: float, replica: tuple[float, float],
                      redis_back: float, pause: float, resume: float) -> list[Step]:
    """API replica 0 killed and restarted; Redis killed, replica 1 killed and restarted while
    Redis is down (`replica`), Redis restarted on its AOF; Redis frozen and thawed."""
    return [
        Step(api, "kill_api", 0), Step(api_back, "start_api", 0),
        Step(redis, "kill_redis"),
        Step(replica[0], "kill_api", 1, "while Redis is down"),
        Step(replica[1], "start_api", 1, "while Redis is down"),
        Step(redis_back, "start_redis"),
        Step(pause, "pause_redis"), Step(resume, "resume_redis"),
    ]


def full(period: float | None = None) -> list[Step]:
    """`make chaos`: a serving worker killed every 8 s for the whole `period` (90 s unless
    submissions are spread over longer; Stack.kill_worker says which), and each heavier fault
    once, apart."""
    period = period or 90.0
    steps = [Step(t, "kill_worker") for t in range(8, int(period), 8)]
    steps += _each_heavy_fault(20, 25, 40, (41, 41.5), 43, 60, 70)
    return sorted(steps, key=lambda s: s.at)


def short(_period: float | None = None) -> list[Step]:
    """The test's: one of each fault, in about 25 s."""
    return [Step(3, "kill_worker"), *_each_heavy_fault(6, 9, 12, (12.5, 13), 15, 18, 23)]


def none(_period: float | None = None) -> list[Step]:
    """No fault: the same load alone, what the machine does without the nemesis."""
    return []


def _failover_pair(kill: float, back: float) -> list[Step]:
    return [Step(kill, "kill_primary"), Step(back, "restart_old_primary")]


def _pause(at: float, seconds: float) -> list[Step]:
    return [Step(at, "pause_replica"), Step(at + seconds, "resume_replica")]


def failover(period: float | None = None) -> list[Step]:
    """`make chaos`'s second run, on a Sentinel stack: a serving worker killed every 8 s, two
    failovers (each primary killed, the old one back as a replica 5 s later), the replica
    frozen for 3 s twice while both nodes are up, a sentinel killed and restarted, and an API
    replica killed and restarted. A failover's kill step lasts until the sentinels promote the
    replica, so what follows it may run a few seconds late; the gaps allow for that."""
    period = period or 120.0
    steps = [Step(t, "kill_worker") for t in range(8, int(period), 8)]
    steps += _failover_pair(0.2 * period, 0.2 * period + 5)
    steps += _pause(0.32 * period, 3)
    steps += [Step(0.4 * period, "kill_sentinel", 2), Step(0.45 * period, "restart_sentinel", 2)]
    steps += [Step(0.5 * period, "kill_api", 0), Step(0.5 * period + 3, "start_api", 0)]
    steps += _failover_pair(0.6 * period, 0.6 * period + 5)
    steps += _pause(0.75 * period, 3)
    return sorted(steps, key=lambda s: s.at)


def failover_short(_period: float | None = None) -> list[Step]:
    """The test's: one failover and one of each other fault, in about 30 s."""
    return [Step(3, "kill_worker"), *_failover_pair(5, 10), *_pause(17, 3),
            Step(21, "kill_sentinel", 2), Step(23, "restart_sentinel", 2),
            Step(25, "kill_api", 0), Step(27, "start_api", 0), Step(29, "kill_worker")]


PROFILES = {"full": full, "short": short, "none": none, "failover": failover,
            "failover-short": failover_short}
PROFILE_KINDS = {"full": KINDS, "short": KINDS, "none": {}, "failover": FAILOVER_KINDS,
                 "failover-short": FAILOVER_KINDS}
SENTINEL_PROFILES = {"failover", "failover-short"}  # run on a SentinelStack


@dataclass
class Logged:
    at: float  # seconds after the chaos phase starts
    step: Step
    detail: str  # the pid acted on, or the error
    ok: bool
    answered_after: float | None = None  # a restarted API replica: until /healthz answered

    @property
    def injected(self) -> bool:
        return self.ok and not self.detail.startswith("skipped")


class FaultRunner(threading.Thread):
    def __init__(self, stack: Stack, steps: list[Step], t0: float,
                 kinds: dict[str, tuple[str, ...]] | None = None) -> None:
        super().__init__(name="chaos-faults", daemon=True)
        self.stack, self.steps, self.t0 = stack, steps, t0
        self.kinds = KINDS if kinds is None else kinds
        self.log: list[Logged] = []
        self._stop_event = threading.Event()
        self._watchers: list[threading.Thread] = []

    def run(self) -> None:
        for step in self.steps:
            if self._stop_event.wait(max(0.0, self.t0 + step.at - time.time())):
                return
            started = time.monotonic()
            try:
                detail, ok = self._do(step), True
            except Exception as exc:  # logged as a failed step; the run reports it
                detail, ok = f"{type(exc).__name__}: {exc}", False
            entry = Logged(time.time() - self.t0, step, detail, ok)
            self.log.append(entry)
            if ok and step.action == "start_api":
                self._watch_api(entry, started)

    def _watch_api(self, entry: Logged, started: float) -> None:
        """How long the replica takes to answer again, measured beside the schedule."""
        def watch() -> None:
            entry.answered_after = self.stack.api_answers_after(entry.step.replica, started,
                                                                API_BACK_TIMEOUT)

        thread = threading.Thread(target=watch, name="chaos-api-watch", daemon=True)
        thread.start()
        self._watchers.append(thread)

    def _do(self, step: Step) -> str:
        s = self.stack
        if step.action == "kill_worker":
            return s.kill_worker()
        if step.action == "kill_api":
            return f"api{step.replica} pid {s.kill_api(step.replica)}"
        if step.action == "start_api":
            return f"api{step.replica} pid {s.start_api(step.replica)}"
        if step.action == "kill_redis":
            return f"pid {s.kill_redis()}"
        if step.action == "start_redis":
            return f"pid {s.start_redis()}"
        if step.action == "pause_redis":
            return f"pid {s.pause_redis()}"
        if step.action == "resume_redis":
            return f"pid {s.resume_redis()}"
        if isinstance(s, SentinelStack):
            if step.action in ("kill_primary", "restart_old_primary", "pause_replica",
                               "resume_replica"):
                return str(getattr(s, step.action)())
            if step.action in ("kill_sentinel", "restart_sentinel"):
                return str(getattr(s, step.action)(step.sentinel))
        raise ValueError(f"unknown fault step {step.action}")

    def cancel(self) -> None:
        self._stop_event.set()

    def finish(self, timeout: float = 60.0) -> None:
        self.join(timeout)
        for w in self._watchers:
            w.join(API_BACK_TIMEOUT + 5)  # each gives up by itself

    @property
    def last_fault_at(self) -> float | None:
        """Seconds after t0 when the last fault was done: where recovery is measured from."""
        return max((e.at for e in self.log if e.injected), default=None)

    def missing_kinds(self) -> list[str]:
        """Fault kinds the log does not show done (a skipped kill is not one)."""
        if not self.steps:
            return []  # the `none` profile
        done = [e for e in self.log if e.injected]
        actions = {e.step.action for e in done}
        missing = [k for k, acts in self.kinds.items() if not set(acts) <= actions]
        during_redis_down = [e for e in done if e.step.note == "while Redis is down"]
        if ("API restart while Redis is down" in self.kinds and len(during_redis_down) < 2
                and "API restart while Redis is down" not in missing):
            missing.append("API restart while Redis is down")
        planned = sum(s.action == "kill_primary" for s in self.steps)
        made = [f for f in getattr(self.stack, "failovers", []) if f.new_port != f.old_port]
        if len(made) < planned:
            missing.append(f"failovers ({len(made)} of {planned} seen)")
        return missing
