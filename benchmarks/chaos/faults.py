"""The fault schedule of a chaos run, and the thread that plays it against the stack.

A schedule is plain data (when, what), so a profile can be read, printed and tested without a
stack; every step that ran is logged with its time, and a step that raised is logged as such
(and fails the run) rather than silently leaving a fault out.
"""

import threading
import time
from dataclasses import dataclass

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


PROFILES = {"full": full, "short": short, "none": none}


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
    def __init__(self, stack: Stack, steps: list[Step], t0: float) -> None:
        super().__init__(name="chaos-faults", daemon=True)
        self.stack, self.steps, self.t0 = stack, steps, t0
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
        missing = [k for k, acts in KINDS.items() if not set(acts) <= actions]
        during_redis_down = [e for e in done if e.step.note == "while Redis is down"]
        if len(during_redis_down) < 2 and "API restart while Redis is down" not in missing:
            missing.append("API restart while Redis is down")
        return missing
