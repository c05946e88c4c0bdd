"""The command line: `fibermill [global options] <command> [options]`."""

import argparse
import os
from pathlib import Path

from services.cli import exitcodes

DEFAULT_URL = "http://127.0.0.1:8000"
METAVAR = {int: "N", float: "X", str: "TEXT"}

# Input options by the task they belong to: (flag, input field, type, help).
IMAGE_OPTIONS = [
    (("-n", "--images-per-prompt"), "num_images_per_prompt", int, "images for each prompt"),
    (("--steps",), "steps", int, "denoise steps (model default if unset)"),
    (("--width",), "width", int, "image width, a multiple of 8"),
    (("--height",), "height", int, "image height, a multiple of 8"),
    (("--guidance-scale",), "guidance_scale", float, "classifier-free guidance scale"),
    (("--negative-prompt",), "negative_prompt", str, "what the images should not show"),
]
TEXT_OPTIONS = [
    (("--max-new-tokens",), "max_new_tokens", int, "tokens to generate at most"),
    (("--temperature",), "temperature", float, "sampling temperature; 0 is greedy"),
    (("--top-p",), "top_p", float, "nucleus sampling threshold"),
    (("--top-k",), "top_k", int, "sample among the k likeliest tokens; 0 disables"),
]


GLOBAL_RULE = """The global options (--url, --api-key, --json, --timeout) go before or after
the command; one given in both places takes its value from after the command."""


def _global_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """The main parser has them with their defaults. Each command's parser has them again
    with none (SUPPRESS): argparse then copies only those given after the command over the
    main parser's values, which is what makes the later placement win."""
    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    group = parser.add_argument_group("global options")
    group.add_argument("--url", default=default(os.environ.get("FIBERMILL_URL") or DEFAULT_URL),
                       help=f"the API's base URL (default: $FIBERMILL_URL, else {DEFAULT_URL})")
    group.add_argument("--api-key", default=default(os.environ.get("FIBERMILL_API_KEY")),
                       metavar="KEY", help="API key (default: $FIBERMILL_API_KEY)")
    group.add_argument("--json", action="store_true", default=default(False),
                       help="print JSON on stdout, for scripts")
    group.add_argument("--timeout", type=float, default=default(30.0), metavar="SECONDS",
                       help="HTTP timeout of one request (default 30)")


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, defaults=False)
    return common


def _follow_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wait", action="store_true",
                   help="follow the job until it ends; the exit code tells how it ended")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="write the outputs into DIR once the job ends (implies --wait)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fibermill", description=f"Submit and follow Fibermill jobs.\n\n{GLOBAL_RULE}",
        epilog=exitcodes.HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    _global_options(parser, defaults=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    common = _common()

    p = sub.add_parser("submit", parents=[common], help="submit a job",
                       description="Submit a job; prints its id, or follows it with --wait.")
    p.add_argument("-m", "--model", required=True, help="a model from `fibermill models`")
    p.add_argument("-p", "--prompt", dest="prompts", action="append", required=True,
                   metavar="TEXT", help="a prompt; repeat for several")
    p.add_argument("--task", choices=["image-generation", "text-generation"],
                   help="default: the model's task, from /v1/models")
    p.add_argument("--seed", type=int, metavar="N",
                   help="output i uses seed N + i; random if unset (the job records it)")
    images = p.add_argument_group("image models")
    for flags, dest, kind, text in IMAGE_OPTIONS:
        images.add_argument(*flags, dest=dest, type=kind, metavar=METAVAR[kind], help=text)
    texts = p.add_argument_group("text models")
    for flags, dest, kind, text in TEXT_OPTIONS:
        texts.add_argument(*flags, dest=dest, type=kind, metavar=METAVAR[kind], help=text)
    texts.add_argument("--stop", action="append", metavar="TEXT",
                       help="a stop sequence; repeat for several")
    p.add_argument("--priority", type=int, metavar="N", help="0 (first) to 9; default 5")
    p.add_argument("--deadline", type=float, metavar="SECONDS",
                   help="fail the job if it has not finished this long after submit")
    p.add_argument("--idempotency-key", metavar="KEY",
                   help="submitting again with the same key returns the same job")
    _follow_options(p)

    p = sub.add_parser("status", parents=[common], help="show a job")
    p.add_argument("job_id", metavar="ID")
    _follow_options(p)

    p = sub.add_parser("cancel", parents=[common], help="cancel a job")
    p.add_argument("job_id", metavar="ID")

    sub.add_parser("models", parents=[common], help="list the models and their workers")

    p = sub.add_parser("jobs", parents=[common], help="list your recent jobs")
    p.add_argument("--limit", type=int, default=20, help="at most this many (1-100)")
    return parser
