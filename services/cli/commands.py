"""What each `fibermill` command does. Results go to stdout, everything else to stderr."""

import argparse
import json
import sys
from dataclasses import dataclass, field

from rich.console import Console

from services.cli import exitcodes, render
from services.cli.args import IMAGE_OPTIONS, TEXT_OPTIONS
from services.cli.client import Client
from services.cli.outputs import write_outputs
from services.cli.progress import FINAL, display_for, follow
from services.cli.wording import ALREADY, article, listing, plural


class UsageError(Exception):
    pass


@dataclass
class Context:
    client: Client
    out: Console
    err: Console
    job_id: str | None = field(default=None)  # the job in hand, for the Ctrl-C hint


def _print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
    sys.stdout.flush()


def _set(args: argparse.Namespace, options: list) -> list[tuple[str, str]]:
    """(flag, input field) of each option given on the command line."""
    return [(flags[-1], dest) for flags, dest, *_ in options
            if getattr(args, dest) is not None]


def _task(args: argparse.Namespace, ctx: Context) -> str:
    if args.task:
        return args.task
    for model in ctx.client.models():
        if model["name"] == args.model:
            if not model["available"]:
                ctx.err.print(f"warning: no worker serves {args.model} now; the job will wait")
            return model["task"]
    # An unknown model: the options tell the task, and the API will name the known models.
    text = _set(args, TEXT_OPTIONS) or args.stop
    return "text-generation" if text else "image-generation"


def _body(args: argparse.Namespace, task: str) -> dict:
    image = task == "image-generation"
    mine, other = (IMAGE_OPTIONS, TEXT_OPTIONS) if image else (TEXT_OPTIONS, IMAGE_OPTIONS)
    wrong = [flag for flag, _ in _set(args, other)]
    if args.stop and image:
        wrong.append("--stop")
    if wrong:
        verb = "does" if len(wrong) == 1 else "do"
        raise UsageError(f"{listing(wrong)} {verb} not apply: {args.model} is "
                         f"{article(task)} {task} model")
    inputs = {"prompts": args.prompts}
    inputs.update({dest: getattr(args, dest) for _, dest in _set(args, mine)})
    if args.seed is not None:
        inputs["seed"] = args.seed
    if args.stop and not image:
        inputs["stop"] = args.stop
    body = {"task": task, "model": args.model, "input": inputs}
    if args.priority is not None:
        body["priority"] = args.priority
    if args.deadline is not None:
        body["deadline_seconds"] = args.deadline
    return body


def submit(args: argparse.Namespace, ctx: Context) -> int:
    body = _body(args, _task(args, ctx))
    job = ctx.client.submit(body, args.idempotency_key)
    ctx.job_id = job["id"]
    if args.wait or args.out:
        return _finish(args, ctx, job)
    if args.json:
        _print_json(job)
    else:
        print(job["id"])
        ctx.err.print(f"job {job['status']}; follow it with: fibermill status {job['id']} --wait")
    return exitcodes.OK


def status(args: argparse.Namespace, ctx: Context) -> int:
    ctx.job_id = args.job_id
    job = ctx.client.job(args.job_id)
    if args.wait or args.out:
        return _finish(args, ctx, job)
    _show(args, ctx, job)
    return exitcodes.for_status(job["status"])


def _finish(args: argparse.Namespace, ctx: Context, job: dict) -> int:
    if job["status"] not in FINAL:
        display = display_for(ctx.err)
        try:
            job = follow(ctx.client, job, display)
        finally:
            display.close()
    files = write_outputs(ctx.client, job, args.out) if args.out else []
    _show(args, ctx, job)
    if files:
        if args.json:
            ctx.err.print(f"wrote {plural(len(files), 'file')} to {args.out}")
        else:
            for path in files:
                print(path)
    return exitcodes.for_status(job["status"])


def _show(args: argparse.Namespace, ctx: Context, job: dict) -> None:
    if args.json:
        _print_json(job)
        return
    render.job_summary(ctx.out, job)
    if not args.out:
        render.results(ctx.out, job, ctx.client.base_url)


def cancel(args: argparse.Namespace, ctx: Context) -> int:
    before = ctx.client.job(args.job_id)
    # Canceling is idempotent in the API (a finished job is left as it is), so whether this
    # call did anything can only be told from the status before it.
    job = before if before["status"] in FINAL else ctx.client.cancel(args.job_id)
    if args.json:
        _print_json(job)
    elif before["status"] in FINAL:
        ctx.out.print(f"job {job['id']} {ALREADY[job['status']]}; nothing to cancel")
    else:
        ctx.out.print(f"job {job['id']} {job['status']}")
    return exitcodes.OK


def models(args: argparse.Namespace, ctx: Context) -> int:
    found = ctx.client.models()
    if args.json:
        _print_json(found)
    else:
        render.models_table(ctx.out, found)
    return exitcodes.OK


def jobs(args: argparse.Namespace, ctx: Context) -> int:
    found = ctx.client.jobs(args.limit)
    if args.json:
        _print_json(found)
    elif found:
        render.jobs_table(ctx.out, found)
    else:
        ctx.err.print("no jobs yet")
    return exitcodes.OK


COMMANDS = {"submit": submit, "status": status, "cancel": cancel, "models": models,
            "jobs": jobs}
