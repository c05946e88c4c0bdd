"""OpenAI requests onto Fibermill jobs, and jobs back into OpenAI's answers.

A chat request becomes a text job whose prompt is the conversation rendered with the model's
chat template; `n` choices are the same prompt `n` times (output i uses seed + i, so sampled
choices differ); a completion's prompts x `n` likewise, in OpenAI's order (prompt by prompt).
Problems are named by the OpenAI field that caused them (`max_tokens`, not the job's
`input.max_new_tokens`), every one at once."""

from typing import Any

from pydantic import ValidationError

from services.api.openai import logprobs
from services.api.openai.chat_template import render_chat
from services.api.openai.errors import error_body
from services.api.openai.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    ImageGenerationRequest,
    OpenAIRequest,
)
from shared.errors import InvalidInput, Problem
from shared.inputs import validate_input
from shared.job import JobRequest
from shared.jobstore import JobRecord
from shared.model_files import chat_template, special_tokens
from shared.problems import from_validation_error
from shared.registry import ModelRegistry, ModelSpec

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
IMAGES = "/v1/images/generations"
ENDPOINTS: dict[str, type[OpenAIRequest]] = {
    CHAT: ChatCompletionRequest,
    COMPLETIONS: CompletionRequest,
    IMAGES: ImageGenerationRequest,
}
BATCH_ENDPOINTS = (CHAT, COMPLETIONS)


def parse(endpoint: str, body: Any) -> OpenAIRequest:
    """The request `body` sent to `endpoint`, or InvalidInput naming each field wrong."""
    kind = ENDPOINTS.get(endpoint)
    if kind is None:
        raise InvalidInput("url", f"{endpoint!r} is not one of {', '.join(ENDPOINTS)}")
    try:
        return kind.model_validate(body)
    except ValidationError as exc:
        raise InvalidInput.of(from_validation_error(exc)) from None


def job_request(req: OpenAIRequest, registry: ModelRegistry,
                priority: int | None = None) -> JobRequest:
    """The Fibermill job that answers `req`; InvalidInput when the model cannot, or the
    request is outside the model's limits."""
    spec = _model_for(req, registry)
    if isinstance(req, ImageGenerationRequest):
        inp: dict[str, Any] = {"prompts": [req.prompt], "num_images_per_prompt": req.n,
                               "seed": req.seed}
        if (size := req.dimensions) is not None:
            inp["width"], inp["height"] = size
        names = {"prompts": "prompt", "num_images_per_prompt": "n", "width": "size",
                 "height": "size", "seed": "seed"}
    else:
        if isinstance(req, ChatCompletionRequest):
            template = chat_template(spec)
            assert template is not None  # checked by _model_for
            prompt = render_chat(template,
                                 [{"role": m.role, "content": m.content} for m in req.messages],
                                 special_tokens(spec))
            prompts, budget = [prompt] * req.n, req.budget
            budget_field = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
            names = {"prompts": "messages", "logprobs": "top_logprobs"}
        else:
            prompts = [p for p in req.prompt for _ in range(req.n)]
            budget, budget_field = req.max_tokens, "max_tokens"
            names = {"prompts": "prompt", "logprobs": "logprobs"}
        inp = {"prompts": prompts, "max_new_tokens": budget, "temperature": req.temperature,
               "top_p": req.top_p, "stop": req.stop, "seed": req.seed, "stream": req.stream}
        if req.alternatives is not None:
            inp["logprobs"] = req.alternatives
        if req.structured is not None:
            inp["response_format"] = req.structured
            names["response_format"] = "response_format"
        names |= {"max_new_tokens": budget_field, "temperature": "temperature",
                  "top_p": "top_p", "stop": "stop", "seed": "seed"}
    try:
        validate_input(spec, inp)
    except InvalidInput as exc:
        problems = [_renamed(p, names, req) for p in exc.problems]
        if isinstance(req, ImageGenerationRequest):
            problems = _one_size_problem(problems, spec, req)
        raise InvalidInput.of(problems) from None
    options = {} if priority is None else {"priority": priority}
    return JobRequest(model=spec.name, input=inp, **options)


def _model_for(req: OpenAIRequest, registry: ModelRegistry) -> ModelSpec:
    spec = registry.get(req.model)  # UnknownModel: a 404 model_not_found, as OpenAI's
    if isinstance(req, ImageGenerationRequest):
        if spec.task != "image-generation":
            raise InvalidInput("model", f"model {spec.name} generates text, not images")
    elif spec.task != "text-generation":
        raise InvalidInput("model", f"model {spec.name} generates images, not text")
    elif isinstance(req, ChatCompletionRequest) and chat_template(spec) is None:
        chat = sorted(n for n, s in registry.models.items() if chat_template(s))
        raise InvalidInput("model", f"model {spec.name} has no chat template: use "
                           f"/v1/completions, or a chat model ({', '.join(chat) or 'none'})")
    return spec


def _renamed(problem: Problem, names: dict[str, str], req: OpenAIRequest) -> Problem:
    """A job input's problem in the words of the OpenAI request."""
    parts = problem.field.split(".")
    field = names.get(parts[1], parts[1]) if len(parts) > 1 and parts[0] == "input" else ""
    if field == "prompts" or (parts[1:2] == ["prompts"] and len(parts) == 2):
        field = "n"  # too many prompts: n (times the prompts) is what the caller chose
    if field == "prompt" and len(parts) > 2 and isinstance(req, CompletionRequest):
        field = f"prompt.{int(parts[2]) // req.n}"  # job prompt i is the request's i // n
    elif field == "stop" and len(parts) > 2:
        field = f"stop.{parts[2]}"
    return Problem(field or problem.field, problem.message, problem.code)


def _one_size_problem(problems: list[Problem], spec: ModelSpec,
                      req: ImageGenerationRequest) -> list[Problem]:
    """The job's width and height problems as the one `size` problem they are in OpenAI's
    request: in its WxH words, with the sizes the model makes and the one asked for."""
    sizes = [p for p in problems if p.field == "size"]
    if not sizes:
        return problems
    lo, hi = spec.limits.min_size, spec.limits.max_size
    makes = (f"only {lo}x{lo} images" if lo == hi else f"WxH images with W and H multiples "
             f"of 8 from {lo} to {hi} ({lo}x{lo} to {hi}x{hi})")
    message = f"model {spec.name} makes {makes} (or auto), not {req.size}"
    first = problems.index(sizes[0])  # where the width's or height's problem was
    rest = [p for p in problems if p.field != "size"]
    return [*rest[:first], Problem("size", message, sizes[0].code), *rest[first:]]


# Answers -------------------------------------------------------------------------------------


def answer_id(req: ChatCompletionRequest | CompletionRequest, job_id: str) -> str:
    return f"{'chatcmpl' if isinstance(req, ChatCompletionRequest) else 'cmpl'}-{job_id}"


def usage(req: ChatCompletionRequest | CompletionRequest,
          outputs: list[dict[str, Any]]) -> dict[str, int]:
    """Tokens read and written; a prompt shared by `n` choices is counted once, as OpenAI
    counts it."""
    read = sum(o.get("prompt_tokens") or 0 for o in outputs[::req.n])
    written = sum(o.get("tokens") or 0 for o in outputs)
    return {"prompt_tokens": read, "completion_tokens": written,
            "total_tokens": read + written}


def text_response(req: ChatCompletionRequest | CompletionRequest,
                  rec: JobRecord) -> dict[str, Any]:
    """The chat.completion or text_completion body of a job that succeeded."""
    outputs = [o or {} for o in rec.output or []]
    common = {"id": answer_id(req, rec.id), "created": int(rec.created_at), "model": rec.model,
              "system_fingerprint": None, "usage": usage(req, outputs)}
    if isinstance(req, ChatCompletionRequest):
        choices = [{"index": i, "message": {"role": "assistant", "content": o.get("text", ""),
                                            "refusal": None},
                    "logprobs": choice_logprobs(req, i, o.get("logprobs")),
                    "finish_reason": o.get("finish_reason")}
                   for i, o in enumerate(outputs)]
        return {**common, "object": "chat.completion", "choices": choices}
    choices = [{"index": i, "text": echoed(req, i) + o.get("text", ""),
                "logprobs": choice_logprobs(req, i, o.get("logprobs")),
                "finish_reason": o.get("finish_reason")}
               for i, o in enumerate(outputs)]
    return {**common, "object": "text_completion", "choices": choices}


def echoed(req: CompletionRequest, index: int) -> str:
    """What choice `index`'s text starts with: its prompt when `echo` is on."""
    return req.prompt[index // req.n] if req.echo else ""


def choice_logprobs(req: ChatCompletionRequest | CompletionRequest, index: int,
                    raw: list[Any] | None) -> dict[str, Any] | None:
    """Choice `index`'s `logprobs` from its output's; null when none were asked (or the output
    has none). A completion's offsets count from the start of the choice's text, so past its
    echoed prompt; the prompt's own tokens have none (only generated tokens are scored)."""
    tokens = logprobs.entries(raw)
    if req.alternatives is None or tokens is None:
        return None
    if isinstance(req, ChatCompletionRequest):
        return logprobs.chat(tokens)
    return logprobs.completion(tokens, logprobs.TextOffsets(len(echoed(req, index))))


def failure(rec: JobRecord) -> tuple[int, dict[str, Any]]:
    """The status and OpenAI error body of a job that failed or was canceled."""
    if rec.error is not None:
        return 500, error_body(f"job {rec.id} failed: {rec.error.message}", "server_error",
                               code=rec.error.code)
    return 409, error_body(f"job {rec.id} was {rec.status.value} before it finished",
                           code=f"job_{rec.status.value}")
