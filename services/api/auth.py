"""Who is calling: API keys (Bearer) when FIBERMILL_API_KEYS is set, else an open API.

Keys are known only by their SHA-256 digests. FIBERMILL_API_KEYS may list each key either as
itself or as `sha256:<hex digest>`, so a deployment need not hold the keys at all. A key's id
(what jobs record as their owner, and what rate limits count by) is a prefix of its digest.
"""

import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from shared.errors import Unauthorized
from shared.settings import Settings, get_settings

DIGEST_PREFIX = "sha256:"
KEY_ID_CHARS = 16


@dataclass(frozen=True)
class Principal:
    key_id: str | None  # None when the API is open (no keys configured)
    # The caller's address, so an open API can still rate-limit per client. Not part of the
    # identity: two requests of one key from different addresses are the same principal.
    client: str | None = field(default=None, compare=False)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_id(key_digest: str) -> str:
    return key_digest[:KEY_ID_CHARS]


def configured_digests(settings: Settings) -> list[str]:
    return [
        entry[len(DIGEST_PREFIX) :].lower() if entry.startswith(DIGEST_PREFIX) else digest(entry)
        for entry in settings.api_key_list
    ]


def identify(presented: str, digests: list[str]) -> str | None:
    """The id of the configured key whose digest matches, else None."""
    theirs = digest(presented).encode()
    found = None
    for d in digests:
        # Every digest is compared, and in constant time, so timing says nothing about which.
        if hmac.compare_digest(theirs, d.encode()):
            found = d
    return key_id(found) if found else None


_bearer = HTTPBearer(auto_error=False, description="An API key from FIBERMILL_API_KEYS")


async def current_settings() -> Settings:
    """`get_settings` as a dependency; async, so FastAPI calls it in place rather than in its
    thread pool."""
    return get_settings()


async def authenticate(
    request: Request,
    settings: Annotated[Settings, Depends(current_settings)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    client = request.client.host if request.client else None
    digests = configured_digests(settings)
    if not digests:
        return Principal(None, client)
    found = identify(credentials.credentials, digests) if credentials else None
    if found is None:
        # The same answer for a missing and a wrong key; the key itself is never echoed.
        raise Unauthorized("missing or invalid API key: send `Authorization: Bearer <key>`")
    return Principal(found, client)


PrincipalDep = Annotated[Principal, Depends(authenticate)]
