"""The house has one direction: every import runs down the layers (README "Layout"), and nothing imports in
a circle. The imports are read from the source with ``ast`` (every ``import``, at module level, inside a
function or under ``TYPE_CHECKING``: a type is a dependency too), so a rule broken anywhere fails here with
the rule's name in the message.

The rules are data: :data:`LAYERS` (worker/, bottom to top), :data:`TREE` (the repository's packages,
bottom to top), :data:`PURE` (what the bottom may not import).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: worker/'s layers, bottom to top: a module may import its own layer and the layers below it, never above.
#: A module belongs to the layer of its longest listed prefix (``worker.service.policy`` is a rule, the rest
#: of ``worker.service`` the service).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground", ("worker", "worker.aio", "worker.faults", "worker.redact")),
    ("config", ("worker.config",)),
    ("rules", ("worker.pipeline", "worker.service.policy")),
    ("adapters", ("worker.store", "worker.broker", "worker.invalidation")),
    ("service", ("worker.service",)),
    ("observability", ("worker.observability",)),
    ("runtime", ("worker.runtime",)),
    ("composition root", ("worker.bootstrap", "worker.runner")),
    (
        "entrypoints",
        ("worker.cli", "worker.__main__", "worker.config.__main__", "worker.ops", "worker.testing"),
    ),
)

#: the repository's Python packages, bottom to top: the contract, the worker, the simulator, the bench, the
#: tests (nothing shipped imports sim/, bench/ or tests/)
TREE: tuple[str, ...] = ("contracts", "worker", "sim", "bench", "tests")

#: the bottom of the house does no I/O: the rules import none of these (nor anything of theirs)
PURE: tuple[str, ...] = (
    "asyncio",
    "asyncpg",
    "aio_pika",
    "aiormq",
    "pamqp",
    "redis",
    "socket",
    "subprocess",
    "http",
    "urllib.request",
    "structlog",
    "prometheus_client",
    "opentelemetry",
    "os",
)

#: circles allowed for now, each named with its reason (none: the e2e tier's Stack is in tests/e2e/stack.py,
#: so cluster.py no longer imports conftest.py, which imports cluster.py)
KNOWN_CIRCLES: tuple[frozenset[str], ...] = ()


@dataclass(frozen=True, slots=True)
class Module:
    name: str
    path: Path
    package: bool


def modules(tops: Iterable[str]) -> dict[str, Module]:
    found: dict[str, Module] = {}
    for top in tops:
        for path in sorted((REPO / top).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if "node_modules" in parts or any(part.startswith(".") for part in parts):
                continue
            package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if package else parts)
            found[name] = Module(name, path, package)
    return found


def imported_names(module: Module) -> Iterator[str]:
    """Every name ``module`` imports, absolute (``from . import x`` resolved), with its submodule when a
    ``from`` names one (``from worker.broker import urls`` -> ``worker.broker.urls``)."""
    tree = ast.parse(module.path.read_text(encoding="utf-8"), str(module.path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.name.split(".") if module.package else module.name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def owner(name: str, known: Mapping[str, Module]) -> str | None:
    """The module of ``known`` that ``name`` is, or is in (``worker.faults.explain`` -> ``worker.faults``)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def graph(known: Mapping[str, Module]) -> dict[str, set[str]]:
    return _graph(tuple(known.values()))


@functools.cache
def _graph(known_modules: tuple[Module, ...]) -> dict[str, set[str]]:
    """Module -> the modules it imports of ``known_modules`` (itself and its own packages left out)."""
    known = {module.name: module for module in known_modules}
    arrows: dict[str, set[str]] = {}
    for module in known_modules:
        targets = {owner(name, known) for name in imported_names(module)}
        arrows[module.name] = {t for t in targets if t and t != module.name and not _contains(t, module.name)}
    return arrows


def _contains(package: str, name: str) -> bool:
    # importing a package's own parent (its __init__) is how `from worker.broker import urls` reads
    return name.startswith(package + ".")


def layer_of(name: str) -> tuple[int, str]:
    best = (-1, "", "")
    for index, (layer, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > len(best[2]):
                best = (index, layer, prefix)
    assert best[0] >= 0, f"{name} is in no layer of LAYERS: name its layer in tests/unit/test_layering.py"
    return best[0], best[1]


def circles(arrows: Mapping[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in sorted(arrows):
        if start in index:
            continue
        work = [(start, iter(sorted(arrows.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(arrows.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group: set[str] = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(group)
    return found


def room(name: str) -> str:
    """A module's package one level under the top (``worker.runtime.handler`` -> ``worker.runtime``), or
    the module itself at the top (``worker.cli``)."""
    return ".".join(name.split(".")[:2])


WORKER = modules(["worker"])
EVERYTHING = modules(TREE)


def test_every_import_in_worker_runs_down_the_layers() -> None:
    upward = []
    for source, targets in sorted(graph(WORKER).items()):
        here, layer = layer_of(source)
        for target in sorted(targets):
            there, other = layer_of(target)
            if there > here:
                allowed = ", ".join(name for name, _ in LAYERS[: here + 1])
                upward.append(
                    f"{source} ({layer}) imports {target} ({other}): an upward arrow; "
                    f"rule: the {layer} layer imports only {allowed}"
                )
    assert not upward, "\n".join(upward)


def test_the_rules_do_no_io() -> None:
    broken = []
    for module in WORKER.values():
        if layer_of(module.name)[1] != "rules":
            continue
        for name in sorted(set(imported_names(module))):
            if any(name == library or name.startswith(library + ".") for library in PURE):
                broken.append(
                    f"{module.name} imports {name}: rule: the rules do no I/O (none of {', '.join(PURE)})"
                )
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("where", ["worker", "tree"])
def test_no_module_imports_in_a_circle(where: str) -> None:
    known = WORKER if where == "worker" else EVERYTHING
    found = [group for group in circles(graph(known)) if frozenset(group) not in KNOWN_CIRCLES]
    assert not found, "rule: no module imports itself through others; circles: " + "; ".join(
        " <-> ".join(sorted(group)) for group in found
    )


@pytest.mark.parametrize("where", ["worker", "tree"])
def test_no_two_packages_import_each_other(where: str) -> None:
    known = WORKER if where == "worker" else EVERYTHING
    rooms: dict[str, set[str]] = {}
    for source, targets in graph(known).items():
        rooms.setdefault(room(source), set()).update(room(t) for t in targets if room(t) != room(source))
    if where == "tree":  # tests/ is one room at this scale; its circle is KNOWN_CIRCLES'
        rooms = {name: {t for t in targets if not t.startswith("tests.")} for name, targets in rooms.items()}
    found = circles(rooms)
    assert not found, "rule: packages import in one direction; circles: " + "; ".join(
        " <-> ".join(sorted(group)) for group in found
    )


def test_the_tree_runs_down_contracts_worker_sim_bench_tests() -> None:
    upward = []
    for source, targets in sorted(graph(EVERYTHING).items()):
        here = TREE.index(source.split(".")[0])
        for target in sorted(targets):
            there = TREE.index(target.split(".")[0])
            if there > here:
                upward.append(
                    f"{source} imports {target}: an upward arrow; rule: the tree runs "
                    f"{' < '.join(TREE)} (each imports only those before it)"
                )
    assert not upward, "\n".join(upward)


def test_every_worker_module_has_a_layer() -> None:
    for name in WORKER:
        layer_of(name)


def test_the_checks_see_what_they_guard() -> None:
    """The reader finds the imports it must: a relative import, a function-level import, a circle."""
    known = WORKER
    arrows = graph(known)
    assert "worker.broker.topology" in arrows["worker.bootstrap"]
    assert "worker.runner" in arrows["worker.cli"]  # imported inside main()
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert layer_of("worker.service.policy")[1] == "rules"
    assert layer_of("worker.service.process")[1] == "service"
