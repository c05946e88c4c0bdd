"""/v1/usage: what the calling API key used, per model and UTC day."""

from datetime import date
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from services.api.auth import PrincipalDep, authenticate
from services.api.deps import RedisDep, SettingsDep
from services.api.openapi import errors
from services.api.usage import DEFAULT_DAYS, Usage, usage_report

router = APIRouter(prefix="/v1/usage", tags=["usage"], dependencies=[Depends(authenticate)])


@router.get("", response_model=Usage, responses=errors(401, 422))
async def get_usage(
    principal: PrincipalDep,
    redis: RedisDep,
    settings: SettingsDep,
    start: Annotated[date | None, Query(description=(
        f"First UTC day (YYYY-MM-DD); by default {DEFAULT_DAYS - 1} days before `end`"))] = None,
    end: Annotated[date | None, Query(description="Last UTC day; by default today")] = None,
) -> Usage:
    """The calling key's usage (on an open API, all of it): tokens, images, worker time and
    jobs by final status, per model and day. Counted as work finishes, each output and each
    job once, whatever was retried."""
    return await usage_report(redis, principal.key_id, start, end,
                              settings.usage_retention_days)
