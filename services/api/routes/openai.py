"""OpenAI-compatible generation: /v1/chat/completions, /v1/completions, /v1/images/generations.
Each call is a Fibermill job (services/api/openai); its errors are in OpenAI's format."""

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request, Response

from services.api.auth import PrincipalDep, authenticate
from services.api.openai.deps import CallsDep
from services.api.openai.errors import openai_errors
from services.api.openai.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    ImageGenerationRequest,
)

router = APIRouter(prefix="/v1", tags=["openai"], dependencies=[Depends(authenticate)])

STREAMED = {"text/event-stream": {"description": "With `stream: true`: OpenAI's chunks as "
                                  "Server-Sent Events, then `data: [DONE]`"}}
IdempotencyKey = Annotated[str | None, Header()]
TEXT_ERRORS = openai_errors(400, 401, 404, 409, 429, 500, 503, 504)


def _base(request: Request) -> str:
    return str(request.base_url).rstrip("/")


@router.post("/chat/completions", responses={200: {"content": STREAMED}, **TEXT_ERRORS})
async def chat_completions(req: ChatCompletionRequest, request: Request, calls: CallsDep,
                           principal: PrincipalDep,
                           idempotency_key: IdempotencyKey = None) -> Response:
    """OpenAI's chat completion, on a model with a chat template (GET /v1/models)."""
    return await calls.answer(req, principal, _base(request), idempotency_key)


@router.post("/completions", responses={200: {"content": STREAMED}, **TEXT_ERRORS})
async def completions(req: CompletionRequest, request: Request, calls: CallsDep,
                      principal: PrincipalDep, idempotency_key: IdempotencyKey = None
                      ) -> Response:
    """OpenAI's (legacy) text completion, on any text-generation model."""
    return await calls.answer(req, principal, _base(request), idempotency_key)


@router.post("/images/generations", responses=TEXT_ERRORS)
async def image_generations(req: ImageGenerationRequest, request: Request, calls: CallsDep,
                            principal: PrincipalDep, idempotency_key: IdempotencyKey = None
                            ) -> Response:
    """OpenAI's image generation, on an image-generation model. `url` answers link to the
    job's outputs (read with the same API key), or to presigned URLs where the blob store has
    them."""
    return await calls.answer(req, principal, _base(request), idempotency_key)
