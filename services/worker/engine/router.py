"""Routers: which operator runs after which, from START to END.

A route out of an operator is one of
- the name of the next operator;
- a `Branch`: the first listed operator whose `can_operate(value)` is true runs next;
- a `Split`: the output is a sequence, each element walks the graph from `each` until a route
  reaches `JOIN`, and the list of their results, in input order, goes on to `then`;
- `END`: the walk is over and this output is the result.
"""

from dataclasses import dataclass

from shared.errors import GraphError

START = "__start__"
END = "__end__"
JOIN = "__join__"


@dataclass(frozen=True)
class Branch:
    candidates: tuple[str, ...]

    def __init__(self, *candidates: str) -> None:
        if not candidates:
            raise GraphError("a branch needs at least one candidate")
        object.__setattr__(self, "candidates", tuple(candidates))


@dataclass(frozen=True)
class Split:
    each: str  # first operator of the per-element sub-graph
    then: str  # operator (or END) that receives the joined list


Route = str | Branch | Split


class Router:
    """A graph router: a route per operator name (and one for START)."""

    def __init__(self, routes: dict[str, Route]) -> None:
        if START not in routes:
            raise GraphError("a router needs a route out of START")
        self.routes = dict(routes)

    def next(self, current: str) -> Route:
        try:
            return self.routes[current]
        except KeyError:
            raise GraphError(f"no route out of {current!r}") from None

    def targets(self) -> set[str]:
        """Every operator name a route can lead to (for checking a graph once, up front)."""
        names: set[str] = set()
        for route in self.routes.values():
            if isinstance(route, Branch):
                names.update(route.candidates)
            elif isinstance(route, Split):
                names.update((route.each, route.then))
            else:
                names.add(route)
        return names - {END, JOIN}

