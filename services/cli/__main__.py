"""Entry point of `fibermill` and `python -m services.cli`."""

import sys

from rich.console import Console

from services.cli import exitcodes
from services.cli.args import build_parser
from services.cli.client import ApiError, Client, NotTheApi, Unreachable
from services.cli.commands import COMMANDS, Context, UsageError

# Pipes get a wide fixed width, so tables are not cut to 80 columns and ids stay whole.
PIPE_WIDTH = 160


def _console(stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else PIPE_WIDTH
    return Console(file=stream, highlight=False, width=width)


def _refused(err: Console, exc: ApiError) -> None:
    if exc.fields:
        err.print(f"fibermill: the API refused the request ({exc.status}):")
        for name, message in exc.fields:
            err.print(f"  {name}: {message}", markup=False)
        return
    err.print(f"fibermill: {exc} ({exc.status})", markup=False)
    if exc.status == 401:
        err.print("  set FIBERMILL_API_KEY, or pass --api-key")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out, err = _console(stderr=False), _console(stderr=True)
    with Client(args.url, args.api_key, args.timeout) as client:
        ctx = Context(client, out, err)
        try:
            return COMMANDS[args.command](args, ctx)
        except UsageError as exc:
            err.print(f"fibermill {args.command}: error: {exc}", markup=False)
            return exitcodes.USAGE
        except ApiError as exc:
            _refused(err, exc)
            return exitcodes.API_ERROR
        except (Unreachable, NotTheApi) as exc:
            err.print(f"fibermill: {exc}", markup=False)
            return exitcodes.UNREACHABLE
        except KeyboardInterrupt:
            if ctx.job_id:
                err.print(f"\ninterrupted; job {ctx.job_id} keeps running "
                          f"(fibermill cancel {ctx.job_id} stops it)")
            return exitcodes.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
