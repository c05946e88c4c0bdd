"""Human-readable output: jobs, models, results. Scripts use --json instead."""

from datetime import UTC, datetime

from rich.console import Console
from rich.table import Table
from rich.text import Text

from services.cli.wording import plural

STATUS_STYLE = {"queued": "dim", "running": "blue", "succeeded": "green", "failed": "red",
                "canceled": "yellow"}


def status_text(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def prompt_of(job: dict, index: int) -> str:
    prompts = job["input"].get("prompts") or []
    per = job["input"].get("num_images_per_prompt") or 1
    if job["task"] != "image-generation":
        per = 1
    return prompts[index // per] if index // per < len(prompts) else ""


def queue_line(queue: dict | None, now: datetime | None = None) -> str | None:
    """A queued job's place in line and estimated start, in words: "3rd in line (2 outputs
    ahead), starts in about 40s (at 12:03:10 UTC)"; None when the job says nothing of it."""
    if not queue:
        return None
    ahead = plural(queue["ahead"], "output")
    line = f"{_ordinal(queue['position'])} in line ({ahead} ahead)"
    if not queue.get("estimated_start"):
        return f"{line}, no estimate yet (nothing of its model finished lately)"
    at = datetime.fromisoformat(queue["estimated_start"].replace("Z", "+00:00"))
    wait = max(0.0, (at - (now or datetime.now(UTC))).total_seconds())
    return f"{line}, starts in about {_duration(wait)} (at {at:%H:%M:%S} UTC)"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def job_summary(console: Console, job: dict) -> None:
    p, m = job["progress"], job.get("metrics") or {}
    head = Text.assemble(("job ", "bold"), (job["id"], "bold"), " ", status_text(job["status"]))
    console.print(head)
    console.print(f"  {job['model']} · {job['task']} · {p['done']}/{p['total']} outputs · "
                  f"queued {_seconds(m.get('queue_seconds'))} · "
                  f"ran {_seconds(m.get('run_seconds'))}", highlight=False)
    if (queue := queue_line(job.get("queue"))) is not None:
        console.print(f"  {queue}", highlight=False)
    if job.get("error"):
        console.print(f"  error {job['error']['code']}: {job['error']['message']}",
                      style="red", highlight=False)


def results(console: Console, job: dict, base_url: str = "") -> None:
    for i, item in enumerate(job.get("output") or []):
        prompt = prompt_of(job, i)
        if item is None:
            console.print(f"  [{i}] {prompt!r}: no output", highlight=False)
        elif job["task"] == "image-generation":
            console.print(f"  [{i}] {prompt!r} seed {item['seed']} "
                          f"{item['width']}x{item['height']} {_absolute(item['url'], base_url)}",
                          highlight=False)
        else:
            tokens = plural(item["tokens"], "token")
            console.print(f"  [{i}] {prompt!r} → {item['text']!r} "
                          f"({item['finish_reason']}, {tokens})", highlight=False)


def _absolute(url: str, base_url: str) -> str:
    return url if "://" in url else base_url + url


def jobs_table(console: Console, jobs: list[dict]) -> None:
    table = Table(box=None, pad_edge=False)
    for name in ("ID", "MODEL", "STATUS", "OUTPUTS", "CREATED"):
        table.add_column(name, no_wrap=True)
    for job in jobs:
        p = job["progress"]
        created = job["created_at"][:19].replace("T", " ")
        table.add_row(job["id"], job["model"], status_text(job["status"]),
                      f"{p['done']}/{p['total']}", created)
    console.print(table)


def models_table(console: Console, models: list[dict]) -> None:
    table = Table(box=None, pad_edge=False)
    for name in ("NAME", "TASK", "KIND", "WORKERS", "DESCRIPTION"):
        table.add_column(name, no_wrap=name != "DESCRIPTION")
    for m in models:
        workers = Text(str(len(m["workers"])), style="" if m["available"] else "red")
        table.add_row(m["name"], m["task"], m["kind"], workers, m.get("description") or "")
    console.print(table)
