"""Turn a prompt such as "7", "seven" or "a handwritten 7" into a class index."""

import re

from shared.errors import InvalidInput

_WORD = re.compile(r"[a-z0-9]+")


def resolve_class(prompt: str, classes: list[list[str]], field: str = "prompt") -> int:
    words = set(_WORD.findall(prompt.lower()))
    found = {i for i, names in enumerate(classes) if words & {n.lower() for n in names}}
    if len(found) == 1:
        return found.pop()
    understood = ", ".join("/".join(names) for names in classes)
    if not found:
        raise InvalidInput(field, f"{prompt!r} names no class this model knows ({understood})")
    raise InvalidInput(field, f"{prompt!r} names more than one class; name exactly one")
