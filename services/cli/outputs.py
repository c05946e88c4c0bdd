"""Write a job's outputs to a folder: images as PNG, texts as UTF-8."""

from pathlib import Path

from services.cli.client import Client


def write_outputs(client: Client, job: dict, folder: Path) -> list[Path]:
    """One file per produced output, named `<job id>-<index>`, so jobs never overwrite each
    other; outputs that do not exist (a failed or canceled job) are skipped."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for i, item in enumerate(job.get("output") or []):
        if item is None:
            continue
        if job["task"] == "image-generation":
            path = folder / f"{job['id']}-{i}.png"
            path.write_bytes(client.output(item["url"]))
        else:
            path = folder / f"{job['id']}-{i}.txt"
            path.write_text(item["text"], encoding="utf-8")
        written.append(path)
    return written
