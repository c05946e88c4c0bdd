"""The worker package's shape: imports run one way (no cycle, none hidden inside a function),
and only services/worker/exits.py ends the process."""

import ast
from pathlib import Path

from shared.settings import REPO_ROOT

PACKAGE = REPO_ROOT / "services" / "worker"
# Imported where used so that a worker serving only text models never imports diffusers, and
# the model builders only what they build.
DEFERRED_ON_PURPOSE = {"services.worker.pipelines.factory"}


def _module(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module) -> list[tuple[ast.AST, str]]:
    """(node, imported module or module.name) for every import outside `if TYPE_CHECKING:`."""
    typing_only = {id(n) for top in tree.body
                   if isinstance(top, ast.If) and "TYPE_CHECKING" in ast.unparse(top.test)
                   for n in ast.walk(top)}
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            out += [(node, node.module)] + [(node, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(node, a.name) for a in node.names]
    return out


def _graph() -> tuple[dict[str, set[str]], list[tuple[str, str]]]:
    trees = {_module(p): ast.parse(p.read_text()) for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in trees}
    deferred = []
    for mod, tree in trees.items():
        top = {id(n) for n in tree.body}
        for node, target in _imports(tree):
            if target in trees and target != mod:
                edges[mod].add(target)
                if id(node) not in top:
                    deferred.append((mod, target))
    return edges, deferred


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                return [*path[path.index(n):], n]
            if n not in state and (found := visit(n)):
                return found
        state[m] = 2
        path.pop()
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_worker_imports_have_no_cycle():
    edges, _ = _graph()
    assert _cycle(edges) is None, " -> ".join(_cycle(edges) or [])


def test_the_runtime_is_assembled_from_parts_that_do_not_import_it():
    edges, _ = _graph()
    runtime = "services.worker.runtime"
    assert not [m for m, targets in edges.items() if runtime in targets and
                m != "services.worker.celery_app"]
    parts = {"handler", "heartbeat", "cancellation", "drain", "flights", "progress", "exits"}
    assert {f"services.worker.{p}" for p in parts} <= edges[runtime] | {
        t for p in edges[runtime] for t in edges[p]}


def test_no_import_hides_inside_a_function():
    _, deferred = _graph()
    assert [(m, t) for m, t in deferred if m not in DEFERRED_ON_PURPOSE] == []


def test_only_exits_ends_the_process():
    callers = [
        _module(p) for p in PACKAGE.rglob("*.py")
        if "_exit(" in p.read_text() and p.name != "exits.py"
    ]
    assert callers == []


# What of the engine drives a model: pipelines offer model code (engine/model_code.py) and
# never see how it is scheduled.
SCHEDULING = {"batcher", "decoder", "decoder_rows", "engine", "factory", "graph_runner",
              "run_stops", "scheduler", "scheduling", "settle", "start"}


def _all_imports() -> dict[str, set[str]]:
    """Every module's imports inside the worker package, type-only ones included."""
    edges: dict[str, set[str]] = {}
    for p in PACKAGE.rglob("*.py"):
        targets = edges.setdefault(_module(p), set())
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets.update([node.module, *(f"{node.module}.{a.name}" for a in node.names)])
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
    return edges


def test_pipelines_import_nothing_of_the_engines_scheduling():
    forbidden = {f"services.worker.engine.{m}" for m in SCHEDULING}
    assert {(m, t) for m, targets in _all_imports().items()
            if m.startswith("services.worker.pipelines") for t in targets & forbidden} == set()


def test_the_engine_imports_nothing_of_the_pipelines():
    assert {(m, t) for m, targets in _all_imports().items()
            if m.startswith("services.worker.engine") for t in targets
            if t.startswith("services.worker.pipelines")} == set()
