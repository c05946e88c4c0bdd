"""One API key's usage (GET /v1/usage): its counters per model and UTC day over a range of
days, and their totals, read from the per-day hashes the scripts keep (shared/usage.py)."""

from collections import defaultdict
from datetime import UTC, date, datetime, timedelta

import redis.asyncio as aioredis
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field

from shared.job import FINAL_STATUSES
from shared.usage import JOBS_PREFIX, read_days

DEFAULT_DAYS = 30


class UsageCounts(BaseModel):
    prompt_tokens: int = Field(0, description="Prompt tokens the model read (text)")
    completion_tokens: int = Field(0, description="Tokens generated (text)")
    images: int = Field(0, description="Images generated")
    device_seconds: float = Field(0.0, description=(
        "Worker time of its outputs, from a worker taking one to its result, summed (outputs "
        "batched together each count their own)"))
    jobs: dict[str, int] = Field(default_factory=lambda: dict.fromkeys(
        sorted(s.value for s in FINAL_STATUSES), 0), description="Jobs that ended, by final "
        "status")

    def add(self, metric: str, n: int) -> None:
        if metric.startswith(JOBS_PREFIX):
            status = metric[len(JOBS_PREFIX):]
            self.jobs[status] = self.jobs.get(status, 0) + n
        elif metric == "device_ms":
            self.device_seconds = round(self.device_seconds + n / 1000, 3)
        elif metric in ("prompt_tokens", "completion_tokens", "images"):
            setattr(self, metric, getattr(self, metric) + n)


class UsageRow(UsageCounts):
    day: date = Field(description="The UTC day (by the server's clock) it was counted on")
    model: str = Field(description="The model that did the work")


class Usage(BaseModel):
    key: str | None = Field(description="The calling API key's id; null on an open API, "
                            "whose usage is all of it")
    start: date = Field(description="The first day counted (UTC)")
    end: date = Field(description="The last day counted (UTC)")
    data: list[UsageRow] = Field(description="One row per day and model with anything "
                                 "counted, by day, then model")
    totals: UsageCounts = Field(description="The rows added up")


def day_range(start: date | None, end: date | None, today: date, max_days: int) -> list[date]:
    """The days from `start` to `end` (by default the DEFAULT_DAYS up to `today`); a range
    upside down or longer than `max_days` (what is kept) is refused as its query parameter's
    422, naming it."""
    end = end or today
    start = start or end - timedelta(days=DEFAULT_DAYS - 1)
    if start > end:
        raise _refused("start", f"must be on or before end ({start} is after {end})", start)
    days = (end - start).days + 1
    if days > max_days:
        raise _refused("end", f"the range is at most {max_days} days (usage is kept that long); "
                       f"{start} to {end} is {days} days", end)
    return [start + timedelta(days=i) for i in range(days)]


async def usage_report(redis: aioredis.Redis, owner: str | None, start: date | None,
                       end: date | None, max_days: int) -> Usage:
    """`owner`'s usage (None: the open API's); today is the Redis server's, as the counters'
    days are."""
    now, _ = await redis.time()
    days = day_range(start, end, datetime.fromtimestamp(now, UTC).date(), max_days)
    counted = await read_days(redis, owner, days)
    rows: dict[tuple[date, str], UsageRow] = {}
    totals = UsageCounts()
    for day, fields in sorted(counted.items()):
        per_model: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for field, n in fields.items():
            model, _, metric = field.rpartition("|")
            per_model[model].append((metric, n))
        for model in sorted(per_model):
            row = rows[(day, model)] = UsageRow(day=day, model=model)
            for metric, n in per_model[model]:
                row.add(metric, n)
                totals.add(metric, n)
    return Usage(key=owner, start=days[0], end=days[-1], data=list(rows.values()),
                 totals=totals)


def _refused(field: str, message: str, value: date) -> RequestValidationError:
    """A query parameter's problem, worded and placed as FastAPI's own validation puts it."""
    return RequestValidationError([{"type": "value_error", "loc": ("query", field),
                                    "msg": message, "input": value.isoformat()}])
