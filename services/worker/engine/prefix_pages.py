"""What a prompt's full KV-cache pages hold, as digests that name each page's tokens and every
token before them: two prompts' pages j have equal digests only when the prompts agree up to
the end of page j, which is when their keys and values are the same (the cache holds keys
after positions were applied, text_cache.py). BLAKE2b of 128 bits, not Python's `hash`: a
collision would hand one caller's cached keys to another's prompt.

A scope (by default the API key's id, `FIBERMILL_PREFIX_CACHE_SCOPE`) begins the chain, so
only prompts of one scope share pages: a shared page answers sooner, and how soon would tell
one tenant what another's prompts begin with."""

import hashlib
from array import array

from services.worker.engine.text_cache import PAGE_TOKENS


def page_digests(tokens: list[int], scope: str = "") -> list[bytes]:
    """The digests of `tokens`' full pages, in order, within `scope`."""
    out: list[bytes] = []
    parent = hashlib.blake2b(scope.encode(), digest_size=16).digest() if scope else b""
    for start in range(0, len(tokens) - PAGE_TOKENS + 1, PAGE_TOKENS):
        page = array("q", tokens[start:start + PAGE_TOKENS]).tobytes()
        parent = hashlib.blake2b(parent + page, digest_size=16).digest()
        out.append(parent)
    return out
