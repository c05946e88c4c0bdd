"""The project's shape, checked on its source: imports run one way at every level (module and
package, type-only imports included), no package's `__init__` is imported back by its own
modules, the services import no tooling, and no function takes more than 8 parameters."""

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.settings import REPO_ROOT

# The code that ships (services, shared) and the tooling that does not (benchmarks, model
# building); tests are checked by their own runs.
ROOTS = ("services", "shared", "benchmarks", "modelbuild")
MAX_PARAMETERS = 8


def _sources() -> dict[str, Path]:
    out = {}
    for root in ROOTS:
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            parts = path.relative_to(REPO_ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


SOURCES = _sources()


def _is_package(module: str) -> bool:
    return module in SOURCES and SOURCES[module].name == "__init__.py"


def _owner(target: str) -> str | None:
    """The project module that `target` (a module or module.name) names, if any."""
    while target and target not in SOURCES:
        target = target.rpartition(".")[0]
    return target or None


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """Every project module an import statement loads. `from pkg import sub` loads pkg's
    `__init__` first, so it counts as an import of the package as well as of `sub`."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if owner := _owner(alias.name):
                yield owner
        return
    base = node.module or ""
    if node.level:
        package = module.split(".") if _is_package(module) else module.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, base] if base else package)
    for alias in node.names:
        full = f"{base}.{alias.name}"
        if full in SOURCES:
            yield full
            if _is_package(base):
                yield base
        elif owner := _owner(base):
            yield owner


def _module_graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in SOURCES}
    for module, path in SOURCES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                edges[module] |= set(_targets(module, node)) - {module}
    return edges


def _package_of(module: str) -> str:
    return module if _is_package(module) else module.rpartition(".")[0]


def _package_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Edges between packages; a package and the packages inside it are one line of descent,
    not siblings, so an import between them is no package-level edge."""
    packages: dict[str, set[str]] = {}
    for module, targets in edges.items():
        a = _package_of(module)
        packages.setdefault(a, set())
        for target in targets:
            b = _package_of(target)
            if a != b and not b.startswith(a + ".") and not a.startswith(b + "."):
                packages[a].add(b)
    return packages


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's, iterative: changing
    the recursion limit mid-run upsets CPython 3.11's AST validator in later tests)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(sorted(edges.get(root, ()))))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_checker_sees_cycles_at_both_levels():
    edges = {"p.a": {"q.b"}, "q.b": {"p.c"}, "p.c": set()}
    assert _cycles(edges) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_itself_back():
    assert _cycles(_module_graph()) == []


def test_no_package_imports_itself_back():
    assert _cycles(_package_graph(_module_graph())) == []


def test_no_package_init_is_imported_back_by_its_own_modules():
    edges = _module_graph()
    back = [
        (init, module) for init in SOURCES if _is_package(init)
        for module in edges[init] if module.startswith(init + ".") and init in edges[module]
    ]
    assert back == []


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("shared", ("services", "benchmarks", "modelbuild")),
        ("services.api", ("services.worker", "services.devstack", "benchmarks", "modelbuild")),
        ("services.worker", ("services.api", "services.devstack", "benchmarks", "modelbuild")),
        ("services.cli", ("services.api", "services.worker", "services.devstack", "benchmarks")),
    ],
)
def test_layers_import_only_downward(layer: str, forbidden: tuple[str, ...]):
    edges = _module_graph()
    wrong = sorted(
        (module, target) for module, targets in edges.items()
        if module == layer or module.startswith(layer + ".")
        for target in targets
        if any(target == f or target.startswith(f + ".") for f in forbidden)
    )
    assert wrong == []


def _functions() -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for module, path in SOURCES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield f"{module}:{node.lineno} {node.name}", node


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = node.args
    named = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
    return [n for n in named if n not in ("self", "cls")]


def test_no_function_takes_more_than_eight_parameters():
    over = {where: len(_parameters(node)) for where, node in _functions()
            if len(_parameters(node)) > MAX_PARAMETERS}
    assert over == {}


def test_the_parameter_count_leaves_out_self_only():
    tree = ast.parse("def f(self, a, /, b, *c, d, **e): pass")
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef)
    assert _parameters(node) == ["a", "b", "d"]
