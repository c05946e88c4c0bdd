"""Parse a server-sent event stream into (event, data) pairs."""

import json
from collections.abc import Iterable, Iterator


def parse_events(lines: Iterable[str]) -> Iterator[tuple[str, dict]]:
    """`lines` without their line endings; `data` is JSON, as the API sends it."""
    event, data = "message", list[str]()
    for line in lines:
        if not line:
            if data:
                yield event, json.loads("\n".join(data))
            event, data = "message", []
        elif line.startswith(":"):
            continue  # a keep-alive comment
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
