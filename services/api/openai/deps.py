"""The OpenAI routes' one dependency: a Calls over what the app's lifespan opened."""

from typing import Annotated

from fastapi import Depends, Request

from services.api.deps import SettingsDep
from services.api.openai.calls import Calls


async def _calls(request: Request, settings: SettingsDep) -> Calls:
    s = request.app.state
    return Calls(s.registry, s.submissions, s.limiter, s.hub, s.store, s.watchers, s.lifecycle,
                 s.blobs, settings)


CallsDep = Annotated[Calls, Depends(_calls)]
