"""Follow a job to its end, showing its progress as a rich progress bar on a terminal. Elsewhere
(a pipe, a log) nothing is shown while it runs: the caller prints the final status, once."""

import sys
import time
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from services.cli.client import Client, Unreachable
from services.cli.render import queue_line

FINAL = {"succeeded", "failed", "canceled"}
POLL_SECONDS = 1.0
# A queued job with work ahead of it is polled this often for its place in line (its event
# stream says nothing until it starts); one next in line is followed by its events at once.
QUEUE_POLL_SECONDS = 1.0
GIVE_UP_SECONDS = 60.0  # an API silent this long is not restarting


class Display(Protocol):
    def status(self, job: dict) -> None: ...
    def progress(self, done: int, total: int) -> None: ...
    def step(self, index: int, step: int, steps: int) -> None: ...
    def close(self) -> None: ...


class Silent:
    def status(self, job: dict) -> None:
        pass

    def progress(self, done: int, total: int) -> None:
        pass

    def step(self, index: int, step: int, steps: int) -> None:
        pass

    def close(self) -> None:
        pass


class Bars:
    """Outputs done of total, and the denoise step (or token) of the latest running output."""

    def __init__(self, console: Console) -> None:
        self.bars = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self.outputs: TaskID = self.bars.add_task("queued", total=None)
        self.steps: TaskID | None = None
        self.unit = "step"
        self.bars.start()

    def status(self, job: dict) -> None:
        self.unit = "token" if job["task"] == "text-generation" else "step"
        p = job["progress"]
        description = f"{job['status']:<9} outputs"
        if job["status"] == "queued" and (queue := queue_line(job.get("queue"))):
            description = f"queued: {queue}"
        self.bars.update(self.outputs, description=description,
                         completed=p["done"], total=p["total"])
        # Step events are throttled, so the last one drawn is rarely the last step: a step bar
        # left on the screen would end short of done. The outputs bar shows the end.
        if job["status"] in FINAL and self.steps is not None:
            self.bars.update(self.steps, visible=False)

    def progress(self, done: int, total: int) -> None:
        self.bars.update(self.outputs, completed=done, total=total)

    def step(self, index: int, step: int, steps: int) -> None:
        description = f"  output #{index + 1} {self.unit}"
        if self.steps is None:
            self.steps = self.bars.add_task(description, total=steps)
        self.bars.update(self.steps, description=description, completed=step, total=steps,
                         visible=True)

    def close(self) -> None:
        self.bars.stop()


def display_for(console: Console) -> Display:
    return Bars(console) if console.is_terminal else Silent()


def follow(client: Client, job: dict, display: Display) -> dict:
    """The job once final: from its event stream, or by polling if the stream breaks. While
    it waits behind others it is polled, so that its place in line is shown."""
    display.status(job)
    job = wait_in_line(client, job, display)
    try:
        for event, data in client.events(job["id"]):
            if event == "status":
                job = data
                display.status(job)
            elif event == "progress":
                display.progress(data["done"], data["total"])
            elif event == "step":
                display.step(data["index"], data["step"], data["steps"])
            if job["status"] in FINAL:
                return job
    except Unreachable as exc:
        print(f"fibermill: {exc}; polling instead", file=sys.stderr)
    silent_since = None
    while job["status"] not in FINAL:
        time.sleep(POLL_SECONDS)
        try:
            job = client.job(job["id"])
        except Unreachable:
            silent_since = silent_since or time.monotonic()
            if time.monotonic() - silent_since > GIVE_UP_SECONDS:
                raise
            continue
        silent_since = None
        display.status(job)
    return job


def wait_in_line(client: Client, job: dict, display: Display) -> dict:
    """The job once it is no longer queued behind other work: polled for its place in line
    (and shown) while outputs are ahead of it."""
    while job["status"] == "queued":
        try:
            job = client.job(job["id"])
        except Unreachable:
            break  # the event stream, then polling, deal with an API away
        display.status(job)
        queue = job.get("queue")
        if job["status"] != "queued" or not queue or queue["ahead"] == 0:
            break
        time.sleep(QUEUE_POLL_SECONDS)
    return job
