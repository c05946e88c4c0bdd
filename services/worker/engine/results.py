"""What an item's run gives back: its text, or its image."""

from dataclasses import dataclass

from shared.messages import FinishReason, TokenLogprob


@dataclass
class TextResult:
    text: str
    finish_reason: FinishReason
    tokens: int  # number of generated tokens
    prompt_tokens: int | None = None  # prompt ids the model read (after truncation)
    logprobs: list[TokenLogprob] | None = None  # when its item asked for them


@dataclass
class ImageResult:
    png: bytes
    width: int
    height: int
    seed: int


Result = TextResult | ImageResult
