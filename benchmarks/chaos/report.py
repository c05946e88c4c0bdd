"""What a chaos run counted, and the markdown table it prints.

The counts are the result (the test asserts on them); the table is only their rendering. The
rows that fail a run are named in FAILING, so the exit code, the test and the table's
verdict cannot disagree about what a failure is.
"""

from dataclasses import dataclass, field

from benchmarks.chaos.faults import ACTIONS, Logged
from benchmarks.chaos.sentinel_stack import Failover

# Counts that fail the run when non-zero, with the table's wording.
FAILING = {
    "not_accepted": "submissions never accepted (gave up retrying)",
    "lost": "lost (accepted, then 404)",
    "stuck": "stuck (not final --settle s after the last fault or submission)",
    "failed": "failed or canceled",
    "wrong_output": "wrong output (vs. the quiet run)",
    "webhooks_missing": "webhooks missing (final job, no verified `completed`)",
    "webhooks_unverified": "webhooks failing verification",
    "webhooks_conflicting": "webhooks conflicting (content differs from the job or each other)",
    "submit_5xx": "5xx answers to submissions",
    "extra_jobs": "extra jobs in Redis (a retried submission made a second job)",
    "fault_errors": "fault steps that raised, kinds not injected, replicas never back",
}
# Counts shown for what they say about the run, which faults make non-zero by design.
INFORMATIONAL = {
    "never_final": "of the stuck, never final (waiting stopped: no progress, or --drain)",
    "submit_conn_errors": "connection errors on submissions (retried, same key)",
    "submit_timeouts": "timeouts on submissions (retried, same key)",
    "submit_409": "409 answers on submissions (key still in progress; retried)",
    "submit_not_replicated": "503 `not_replicated` on submissions (stored, no replica yet; "
                             "retried, same key)",
    "webhook_duplicates": "webhook duplicates (same webhook-id and content: at-least-once)",
    "read_5xx": "5xx answers to status/output reads",
    "read_conn_errors": "connection errors or timeouts on status/output reads",
}


@dataclass
class ChaosResult:
    profile: str
    jobs: int  # planned
    combos: int
    accepted: int = 0
    not_accepted: int = 0
    lost: int = 0
    stuck: int = 0
    never_final: int = 0
    failed: int = 0
    wrong_output: int = 0
    webhooks_missing: int = 0
    webhooks_unverified: int = 0
    webhooks_conflicting: int = 0
    webhook_duplicates: int = 0
    submit_5xx: int = 0
    submit_conn_errors: int = 0
    submit_timeouts: int = 0
    submit_409: int = 0
    submit_not_replicated: int = 0
    extra_jobs: int = 0
    read_5xx: int = 0
    read_conn_errors: int = 0
    fault_errors: int = 0
    faults: list[Logged] = field(default_factory=list)
    missing_fault_kinds: list[str] = field(default_factory=list)
    failovers: list[Failover] = field(default_factory=list)  # as the sentinels made them
    last_fault_at: float | None = None  # seconds after the chaos phase started
    last_final_at: float | None = None  # the same clock: the last job's completed_at
    seconds: dict[str, float] = field(default_factory=dict)  # phase -> duration
    examples: dict[str, list[str]] = field(default_factory=dict)  # count -> a few job ids
    log_tracebacks: dict[str, int] = field(default_factory=dict)  # log file -> tracebacks

    @property
    def recovery_seconds(self) -> float | None:
        """From the last fault until the last job became final (negative: all were final
        before the last fault); None when no job became final."""
        if self.last_fault_at is None or self.last_final_at is None:
            return None
        return self.last_final_at - self.last_fault_at

    def _recovery(self) -> str:
        if self.last_final_at is None:
            return "no job became final"
        last = f"last job final at +{self.last_final_at:.1f} s"
        if self.last_fault_at is None:
            return f"no fault injected; {last}"
        return (f"last fault at +{self.last_fault_at:.1f} s, {last}: "
                f"{self.recovery_seconds:.1f} s after the last fault")

    def _failovers(self) -> list[str]:
        if not self.failovers:
            return []
        lines = ["", "Failovers (the primary's port before and after; seconds from the kill "
                 "until the sentinels named the new primary):", ""]
        lines += [f"- :{f.old_port} -> :{f.new_port} in {f.seconds:.1f} s"
                  for f in self.failovers]
        lines += ["", f"Submissions rode out {self.submit_not_replicated} `503 not_replicated`, "
                  f"{self.submit_timeouts} timeouts and {self.submit_conn_errors} connection "
                  "errors, each retried with its Idempotency-Key; other 5xx answers fail the run "
                  f"({self.submit_5xx})."]
        return lines

    def failures(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in FAILING if getattr(self, k)}

    @property
    def ok(self) -> bool:
        return not self.failures()

    def example(self, count: str, text: str, limit: int = 5) -> None:
        found = self.examples.setdefault(count, [])
        if len(found) < limit:
            found.append(text)

    def markdown(self) -> str:
        lines = [f"### Chaos run: {self.jobs} jobs, profile `{self.profile}`, "
                 f"{self.combos} distinct bodies", "",
                 "| count | value |", "| --- | ---: |",
                 f"| jobs accepted | {self.accepted} of {self.jobs} |"]
        lines += [f"| {label} | {getattr(self, k)} |" for k, label in FAILING.items()]
        lines += [f"| {label} | {getattr(self, k)} |" for k, label in INFORMATIONAL.items()]
        lines += ["", "Recovery: " + self._recovery(), ""]
        lines += ["Faults (seconds after the chaos phase started):", ""]
        for e in self.faults:
            what = ACTIONS[e.step.action] + (f" {e.step.arg}" if e.step.arg is not None else "")
            note = f" ({e.step.note})" if e.step.note else ""
            up = (f", answering after {e.answered_after:.1f} s"
                  if e.answered_after is not None else "")
            lines.append(f"- +{e.at:5.1f} s {what}{note}: "
                         f"{e.detail if e.ok else 'FAILED ' + e.detail}{up}")
        if not self.faults:
            lines.append("- none")
        if self.missing_fault_kinds:
            lines.append(f"- NOT INJECTED: {', '.join(self.missing_fault_kinds)}")
        lines += self._failovers()
        lines += ["", "Phases: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())]
        if self.log_tracebacks:
            lines.append("Tracebacks in logs: " + ", ".join(
                f"{k} {v}" for k, v in sorted(self.log_tracebacks.items())))
        for k, ids in self.examples.items():
            lines.append(f"Examples of {k}: " + "; ".join(ids))
        verdict = ("PASS" if self.ok else
                   "FAIL: " + ", ".join(f"{k}={v}" for k, v in self.failures().items()))
        lines += ["", f"**{verdict}**", ""]
        return "\n".join(lines)
