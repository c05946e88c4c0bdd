"""/v1/webhook-secret: the secrets that sign the caller's webhooks, and their rotation
(services/api/webhooks/keyring.py)."""

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, Field

from services.api.auth import PrincipalDep, authenticate
from services.api.openapi import ErrorBody, errors
from services.api.webhooks.keyring import Keyring, LiveSecret

router = APIRouter(prefix="/v1/webhook-secret", tags=["webhooks"],
                   dependencies=[Depends(authenticate)])


class RetiredSecret(BaseModel):
    secret: str = Field(description="A secret rotated out, still signing beside the current one")
    signs_until: datetime = Field(description="When it stops signing (UTC)")


class WebhookSecret(BaseModel):
    """The Standard Webhooks secrets that sign the caller's webhooks (its API key's own; on an
    API without keys, the installation's). Every delivery carries one `v1,` signature per
    secret in its `webhook-signature` header: a receiver holding any one of them verifies it."""

    current: str = Field(description="The secret to verify with (`whsec_...`)")
    previous: list[RetiredSecret] = Field(description=(
        "Secrets rotated out that still sign, newest first, until their `signs_until`"))
    overlap_seconds: int = Field(description=(
        "How long a secret rotated out now goes on signing "
        "(FIBERMILL_WEBHOOK_SECRET_OVERLAP_SECONDS)"))


NOT_ROTATABLE: dict[str, Any] = {
    "model": ErrorBody,
    "description": "The API has no keys: its webhooks are signed with the installation's "
                   "secret, which FIBERMILL_WEBHOOK_SECRET sets",
    "content": {"application/json": {"example": {
        "detail": "this API has no keys: its webhooks are signed with the installation's "
                  "secret; change FIBERMILL_WEBHOOK_SECRET ...",
        "code": "not_rotatable"}}},
}


async def _keyring(request: Request) -> Keyring:
    return request.app.state.outbox.keyring


KeyringDep = Annotated[Keyring, Depends(_keyring)]


def _answer(live: list[LiveSecret], overlap_seconds: int, response: Response) -> WebhookSecret:
    response.headers["cache-control"] = "no-store"  # a secret: never kept by a cache on the way
    current, *previous = live
    return WebhookSecret(
        current=current.secret,
        previous=[RetiredSecret(secret=s.secret,
                                signs_until=datetime.fromtimestamp(s.signs_until or 0, UTC))
                  for s in previous],
        overlap_seconds=overlap_seconds,
    )


@router.get("", response_model=WebhookSecret, responses=errors(401))
async def get_webhook_secret(principal: PrincipalDep, keyring: KeyringDep,
                             response: Response) -> WebhookSecret:
    """The secrets signing the caller's webhooks now; the first is made on first use."""
    return _answer(await keyring.secrets(principal.key_id), keyring.overlap_seconds, response)


@router.post("/rotate", response_model=WebhookSecret,
             responses={**errors(401), 409: NOT_ROTATABLE})
async def rotate_webhook_secret(principal: PrincipalDep, keyring: KeyringDep,
                                response: Response) -> WebhookSecret:
    """A new current secret. The one it replaces goes on signing beside it for
    `overlap_seconds`, so receivers can switch to the new one without missing a delivery."""
    return _answer(await keyring.rotate(principal.key_id), keyring.overlap_seconds, response)
