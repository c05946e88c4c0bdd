"""Chat messages into a prompt, with the model's chat template (the Hugging Face format), the
way transformers' `apply_chat_template` renders it: a sandboxed Jinja environment, so a
template from a registry cannot reach the API process."""

from functools import lru_cache

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from shared.errors import InvalidInput


class _TemplateRaised(Exception):
    pass


def _raise(message: str) -> None:
    # Templates call raise_exception() to refuse a conversation (e.g. roles out of order).
    raise _TemplateRaised(message)


@lru_cache(maxsize=32)
def _compiled(source: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise
    return env.from_string(source)


def render_chat(template: str, messages: list[dict[str, str]],
                tokens: dict[str, str] | None = None) -> str:
    """The prompt for `messages` ({role, content}), ending where the assistant's answer
    starts; `tokens` are the tokenizer's special tokens (bos_token...), which templates from a
    tokenizer read. A conversation the template refuses is InvalidInput on `messages`."""
    try:
        return _compiled(template).render(messages=messages, add_generation_prompt=True,
                                          **(tokens or {}))
    except _TemplateRaised as exc:
        raise InvalidInput("messages", str(exc)) from None
    except TemplateError as exc:
        raise InvalidInput("messages", f"the model's chat template failed: {exc}") from None
