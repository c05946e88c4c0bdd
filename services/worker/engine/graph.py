"""A pipeline graph: its operators by name and the router that wires them, checked once."""

from services.worker.engine.operator import Operator
from services.worker.engine.router import Router
from shared.errors import GraphError


class Graph:
    def __init__(self, operators: list[Operator], router: Router) -> None:
        self.operators = {op.name: op for op in operators}
        if len(self.operators) != len(operators):
            raise GraphError("two operators share a name")
        missing = router.targets() - set(self.operators)
        if missing:
            raise GraphError(f"routes lead to unknown operators: {sorted(missing)}")
        self.router = router

    def __getitem__(self, name: str) -> Operator:
        try:
            return self.operators[name]
        except KeyError:
            raise GraphError(f"no operator named {name!r}") from None
