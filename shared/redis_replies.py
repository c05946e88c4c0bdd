"""Narrowing Redis replies to the types the code reads them as.

redis-py types a reply as bytes or str (it cannot know whether a client decodes responses), and
a script's reply as anything. Our clients never decode, so a reply is bytes; these check that
instead of assuming it: a reply of another shape is a bug (in a script, or a client made with
decode_responses), so it raises rather than guesses."""

from collections.abc import Mapping


def integer(reply: object) -> int:
    if isinstance(reply, int):
        return reply
    raise TypeError(f"expected an integer reply, got {reply!r}")


def text(reply: object) -> str:
    if isinstance(reply, bytes):
        return reply.decode()
    if isinstance(reply, str):
        return reply
    raise TypeError(f"expected a string reply, got {reply!r}")


def optional_text(reply: object) -> str | None:
    return None if reply is None else text(reply)


def texts(reply: object) -> list[str]:
    if isinstance(reply, list):
        return [text(r) for r in reply]
    raise TypeError(f"expected an array reply, got {reply!r}")


def raw(reply: object) -> bytes:
    if isinstance(reply, bytes):
        return reply
    raise TypeError(f"expected a bytes reply, got {reply!r}")


def optional_raw(reply: object) -> bytes | None:
    return None if reply is None else raw(reply)


def raw_list(reply: object) -> list[bytes]:
    if isinstance(reply, list):
        return [raw(r) for r in reply]
    raise TypeError(f"expected an array reply, got {reply!r}")


def raw_hash(reply: Mapping[bytes | str, bytes | str]) -> dict[bytes, bytes]:
    """A hash as HGETALL read it, by a client that does not decode."""
    return {raw(k): raw(v) for k, v in reply.items()}


def text_hash(reply: Mapping[bytes, bytes] | Mapping[bytes | str, bytes | str]) -> dict[str, str]:
    """A hash as HGETALL read it, as text; empty when the hash is gone."""
    return {text(k): text(v) for k, v in reply.items()}
