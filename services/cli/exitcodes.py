"""Exit codes, so that scripts can tell a job's outcome without parsing output."""

OK = 0
FAILED = 1  # the job failed
USAGE = 2  # bad arguments (argparse's own code)
CANCELED = 3  # the job was canceled
API_ERROR = 4  # the API refused the request: invalid input, unknown job, bad key, busy
UNREACHABLE = 5  # no answer from the API, or not the API at the URL
PENDING = 6  # the job has not finished yet
INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT

BY_STATUS = {"succeeded": OK, "failed": FAILED, "canceled": CANCELED}

HELP = """exit codes:
  0  success (for a job: it succeeded)
  1  the job failed
  2  bad arguments
  3  the job was canceled
  4  the API refused the request (invalid input, unknown job, bad key, rate limit, busy)
  5  the API could not be reached (nothing answered at --url, or not the API)
  6  the job has not finished yet (status without --wait)
"""


def for_status(status: str) -> int:
    return BY_STATUS.get(status, PENDING)
