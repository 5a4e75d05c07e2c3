"""The README and the pages under docs/ say what is there: the README's layout names every module of worker/
(and only modules that exist) in the layer the layering test gives it, every link resolves, and every
``worker`` subcommand and ``LTM_*`` variable a page shows exists.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_layering import WORKER, layer_of
from worker.cli import _parser
from worker.config import declared

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]


def layout_rows() -> list[tuple[str, str, str]]:
    """(layer, folder, modules) of each row of the README's "Layout" table."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].startswith("`worker/"):
            rows.append((cells[0], cells[1].strip("`"), cells[2]))
    assert rows, "the README's Layout has no table of worker/'s folders"
    return rows


def named_in(cell: str) -> Iterator[str]:
    """The modules a cell names: each code span that is one lowercase name (``consumer``, ``page/``)."""
    for span in re.findall(r"`([^`]+)`", cell):
        if re.fullmatch(r"_{0,2}[a-z][a-z0-9_]*_{0,2}/?", span):
            yield span.rstrip("/")


def test_the_layout_names_every_module_that_exists_and_only_those() -> None:
    named: set[str] = set()
    wrong = []
    for layer, folder, cell in layout_rows():
        package = folder.strip("/").replace("/", ".")
        for name in named_in(cell):
            module = f"{package}.{name}"
            if module not in WORKER:
                wrong.append(f"the Layout names {folder}{name}, which does not exist")
                continue
            named.add(module)
            if layer_of(module)[1] != layer:
                wrong.append(
                    f"the Layout puts {module} in {layer!r}; test_layering.py: {layer_of(module)[1]!r}"
                )
    # a package's __init__ is the package: its folder names it
    unnamed = sorted(m for m, info in WORKER.items() if not info.package and m not in named)
    wrong += [f"{name} is in no row of the README's Layout" for name in unnamed]
    assert not wrong, "\n".join(wrong)


def links(page: Path) -> Iterator[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    yield from re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)}: links to nothing: {broken}"


def code(page: Path) -> Iterator[str]:
    """The code a page shows: its fenced blocks (comments left out) and its inline code spans."""
    text = page.read_text(encoding="utf-8")
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.DOTALL):
        for line in block.splitlines():
            yield re.sub(r"(^|\s)#\s.*$", "", line)
    yield from re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.DOTALL))


def commands() -> dict[str, set[str]]:
    """``worker``'s subcommands, each with its own (``dlq``: ``list``, ``show``, ...)."""
    found: dict[str, set[str]] = {}
    for action in _parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = set()
                for inner in sub._actions:
                    if isinstance(inner, argparse._SubParsersAction):
                        found[name] = set(inner.choices)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_worker_command_a_page_shows_exists(page: Path) -> None:
    known = commands()
    wrong = []
    for snippet in code(page):
        for first, second in re.findall(
            r"(?:^|\s)(?:[^\s=]*/)?worker ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?", snippet
        ):
            if first not in known:
                wrong.append(f"`worker {first}`")
            elif known[first] and second and second not in known[first]:
                wrong.append(f"`worker {first} {second}`")
    assert not wrong, f"{page.relative_to(REPO)} shows commands the CLI lacks: {sorted(set(wrong))}"


def variables_read_elsewhere() -> set[str]:
    """Every ``LTM_*`` name the code, the tests, the deploy files and CI read or set (not the docs)."""
    listed = subprocess.run(
        ["git", "ls-files", "--", ":!*.md", ":!docs/"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    names: set[str] = set()
    for name in listed:
        path = REPO / name
        if path.is_file() and path.stat().st_size < 2_000_000:
            try:
                names.update(re.findall(r"LTM_[A-Z0-9_]*[A-Z0-9]", path.read_text(encoding="utf-8")))
            except UnicodeDecodeError:
                continue
    return names


def test_every_setting_a_page_names_exists() -> None:
    declared_vars = {s.var for s in declared()} | {s.var + "_FILE" for s in declared()}
    elsewhere = variables_read_elsewhere()
    wrong = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for name, star in re.findall(r"(LTM_[A-Z0-9_]*[A-Z0-9_])(\*?)", text):
            if star or name.endswith("_"):  # a family: LTM_RETRY_*, LTM_*_IMAGE
                prefix = name.rstrip("_")
                if not any(v.startswith(prefix) for v in declared_vars | elsewhere):
                    wrong.append(f"{page.relative_to(REPO)}: {name}*")
            elif name not in declared_vars and name not in elsewhere:
                wrong.append(f"{page.relative_to(REPO)}: {name}")
    assert not wrong, "settings named that nothing declares or reads: " + ", ".join(sorted(set(wrong)))


def test_the_checks_catch_what_they_guard() -> None:
    """The readers find a module, a command and a link in the forms the pages use."""
    assert list(named_in("`consumer` (one connection), `page/`, `worker dlq ui`, `LtmStack`")) == [
        "consumer",
        "page",
    ]
    known = commands()
    assert "list" in known["dlq"]
    assert "seed" in known["demo"]
    assert "run" in known
    assert list(links(README))
    assert any("worker demo send" in snippet for snippet in code(README))
