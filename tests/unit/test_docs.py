"""The README and the pages under docs/ say what is there: the README's layout names every module of worker/
(and only modules that exist) in the layer the layering test gives it, every link resolves, and every
``worker`` subcommand and ``LTM_*`` variable a page shows exists. The documents a user reads give their
reasons rather than cite a review or an issue, and every section they or the code's comments name exists.
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
#: every document a user of the worker or of the kit reads
USER_FACING = [
    *PAGES,
    REPO / "contracts" / "CONTRACT.md",
    REPO / "contracts" / "typescript" / "README.md",
    REPO / "deploy" / "README.md",
    REPO / "CAPACITY.md",
]


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


#: a review or an issue given as the reason: "(security review 4, N10)", "newcomer review 4, F3",
#: "(issue 23)", "decided for issue 31, item 11", "the third security review", a finding alone ("(F3)")
CITATION = re.compile(
    r"\b(?:security|newcomer|architecture|ecosystem)\s+reviews?\b|\breviews?\s+[0-9]|\bissues?\s+[0-9]+"
    r"|\b(?:first|second|third|fourth|fifth)\s+(?:\w+\s+)?review\b|\bthe\s+review\b"
    r"|\(\s*(?:[FN][0-9]{1,2}|N-[A-Z])\s*[),;]",
    re.IGNORECASE,
)


def citations(page: Path) -> Iterator[tuple[int, str]]:
    """(line, words) of each citation of a review or an issue on a page, one that wraps a line included."""
    text = page.read_text(encoding="utf-8")
    for match in CITATION.finditer(text):
        yield text.count("\n", 0, match.start()) + 1, " ".join(match.group().split())


@pytest.mark.parametrize("page", USER_FACING, ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_cites_a_review_or_an_issue(page: Path) -> None:
    """A reader outside the project cannot open the reviews or the issues: a page says the reason itself."""
    found = [f"{page.relative_to(REPO)}:{line}: {words!r}" for line, words in citations(page)]
    assert not found, (
        "these lines cite a review or an issue as their reason; say the reason itself (what was found, what "
        "was measured, and the figure), or drop an attribution that carries none:\n" + "\n".join(found)
    )


def plain(text: str) -> str:
    """A heading or a reference as they are compared: no emphasis or code marks, no comment marks where a
    reference wraps, one space, lower case, no closing full stop or colon."""
    text = re.sub(r"\n\s*(?:#|//|\*)?", " ", text)
    text = re.sub(r"[*`]", "", text)
    return " ".join(text.split()).rstrip(".:").strip().lower()


def headings(page: Path) -> tuple[set[str], set[str]]:
    """The sections of a page by their text, and the anchors of its ``#`` headings. A section is a ``#``
    heading (without its number: ``## 7. Dead letters``) or a paragraph or list item that opens in bold
    (``**Batches.**``, ``- **The ledger answers only its own event**``), as these pages head their parts."""
    texts, anchors = set(), set()
    page_text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    for line in page_text.splitlines():
        if heading := re.match(r"#{1,6}\s+(.+?)\s*#*$", line):
            text = heading.group(1)
            # GitHub's anchor: lower case, marks dropped, spaces as hyphens
            anchors.add(re.sub(r"[^\w\- ]", "", plain(text)).replace(" ", "-"))
        elif lead := re.match(r"\s*(?:[-*]\s+|[0-9]+\.\s+)?\*\*(.+?)\*\*", line):
            text = lead.group(1)
        else:
            continue
        texts.add(plain(re.sub(r"^[0-9]+(?:\.[0-9]+)*\.\s+", "", text.strip())))
    return texts, anchors


def names(heading: str, reference: str) -> bool:
    """A reference names a heading when it is its text, or its start up to a bracket or a punctuation mark
    ("Throughput, round two" names "Throughput, round two (2026-12-03)"; "Redis users" does not name "Redis:
    users")."""
    return heading == reference or (
        heading.startswith(reference) and re.match(r"\s*[(,:;.]", heading[len(reference) :]) is not None
    )


#: ``deploy/README.md "Redis: users"``, ``docs/decisions.md, "Batches"``,
#: ``[text](dead-letters.md), "Heading"``
IN_FILE = re.compile(r'((?:[\w.-]+/)*[\w.-]+\.md)\)?,?\s+"([^"]{1,120})"')
#: ``README "Try it locally"``, ``the README's "Tests"``, ``the kit's README, "Testing your shard"``,
#: ``deploy/README "Redis: users"``
IN_README = re.compile(r"((?:kit(?:'s)?\s+)?(?:[\w.-]+/)*README)(?![\w.])(?:'s)?,?\s+\"([^\"]{1,120})\"")
#: ``"Secrets" in [Configuration](configuration.md)``
IN_LINKED = re.compile(r'"([^"]{1,120})"\s+in\s+\[[^\]]*\]\(([^)#\s]+\.md)\)')
#: ``see "A user per shard" below``, ``("Fair shares" above)``, ``see "Tests"``: the page itself
ON_THIS_PAGE = re.compile(r'"([^"\n]{1,120})"\)?\s+(?:below|above)\b|\bsee\s+"([^"\n]{1,120})"(?!\)?\s+in\b)')
#: ``[text](file.md#anchor)``, ``[text](#anchor)``
ANCHORED = re.compile(r"\]\(([^)\s#]*)#([^)\s]+)\)")


def section_references(source: Path) -> Iterator[tuple[int, Path | str, str]]:
    """(line, file or the name that leads nowhere, heading or ``#anchor``) of each section a page or a source
    file names. A page's relative names start at its folder, a source file's at the repository; a name
    given without its folder is the one document of that name (``CONTRACT.md``); ``README`` alone is the
    repository's, the kit's README the TypeScript kit's."""
    text = source.read_text(encoding="utf-8")
    found: list[tuple[int, str | None, str]] = []
    found += [(m.start(), m.group(1), m.group(2)) for m in IN_FILE.finditer(text)]
    found += [(m.start(), m.group(1), m.group(2)) for m in IN_README.finditer(text)]
    if source.suffix == ".md":
        found += [(m.start(), m.group(2), m.group(1)) for m in IN_LINKED.finditer(text)]
        found += [(m.start(), None, m.group(1) or m.group(2)) for m in ON_THIS_PAGE.finditer(text)]
        found += [
            (m.start(), m.group(1) or None, "#" + m.group(2))
            for m in ANCHORED.finditer(text)
            if not re.match(r"^[a-z]+:", m.group(1))
        ]
    for start, name, heading in found:
        line = text.count("\n", 0, start) + 1
        if name is None:
            yield line, source, heading
        elif name.startswith("kit"):
            yield line, REPO / "contracts" / "typescript" / "README.md", heading
        elif name == "README":
            yield line, README, heading
        else:
            name = name + ".md" if name.endswith("README") else name
            bases = [source.parent, REPO] if source.suffix == ".md" else [REPO]
            paths = [(base / name).resolve() for base in bases if (base / name).is_file()]
            if not paths:
                paths = [page for page in [*USER_FACING, REPO / "BENCHMARKS.md"] if page.name == name]
                paths = paths if len(paths) == 1 else []
            yield line, paths[0] if paths else name, heading


def sources_naming_sections() -> list[Path]:
    """The documents a user reads, the measurement log, and the Python of worker/ and tests/ (whose docstrings
    and comments point at the docs); not this file, whose examples are made up."""
    listed = subprocess.run(
        ["git", "ls-files", "--", "worker/*.py", "tests/*.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    code = [REPO / name for name in listed if REPO / name != Path(__file__).resolve()]
    return [*USER_FACING, REPO / "BENCHMARKS.md", *code]


def test_every_section_a_page_or_a_comment_names_exists() -> None:
    """``deploy/README.md "Redis: users"`` is a heading of deploy/README.md, ``see "X" below`` one of the same
    page, ``[text](file.md#anchor)`` an anchor of file.md: a section that moved leaves no reference behind."""
    wrong = []
    for source in sources_naming_sections():
        if not source.is_file():
            continue
        for line, target, heading in section_references(source):
            where = f"{source.relative_to(REPO)}:{line}"
            if isinstance(target, str):
                wrong.append(f"{where}: names {target} {heading!r}, and no such document is here")
                continue
            texts, anchors = headings(target)
            if heading.startswith("#"):
                if heading[1:] not in anchors:
                    wrong.append(
                        f"{where}: {target.relative_to(REPO)} has no heading with the anchor {heading}"
                    )
            elif not any(names(text, plain(heading)) for text in texts):
                wrong.append(f"{where}: {target.relative_to(REPO)} has no section {heading!r}")
    assert not wrong, (
        "references to sections that are not there; point each at the heading that now holds the text:\n"
        + "\n".join(wrong)
    )


def test_the_checks_catch_what_they_guard(tmp_path: Path) -> None:
    """The readers find a module, a command, a link, a citation and a section reference in the forms the pages
    use."""
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
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n\n## 7. Redis: users (the ACL)\n\n"
        '**Batches.** See "Batches" above, "Redis: users" above, "Nowhere" below, see "Redis users".\n'
        "Decided (security\nreview 4, N10; issue 23); the third security review (F3);"
        " [x](#7-redis-users-the-acl).\n"
        "```\n# not a heading\n```\n",
        encoding="utf-8",
    )
    assert [line for line, _ in citations(page)] == [6, 7, 7, 7]
    texts, anchors = headings(page)
    assert texts == {"a page", "redis: users (the acl)", "batches"}
    assert anchors == {"a-page", "7-redis-users-the-acl"}
    named = [(line, heading) for line, _, heading in section_references(page)]
    assert sorted(named) == [
        (5, "Batches"),
        (5, "Nowhere"),
        (5, "Redis users"),
        (5, "Redis: users"),
        (7, "#7-redis-users-the-acl"),
    ]
    assert names("redis: users (the acl)", "redis: users")
    assert not names("redis: users (the acl)", "redis users")
    assert not names("batches", "batch")
    assert names("throughput, round two (2026-12-03)", plain("Throughput, round\n    # two"))
    comment = tmp_path / "code.py"
    comment.write_text(
        '# deploy/README.md "Redis: users"; README "Try it locally"; CONTRACT.md "Bounds"\n'
        '# deploy/README "Redis users"; the kit\'s README, "Testing your shard"; SPEC.md "Ids"\n',
        encoding="utf-8",
    )
    assert sorted(section_references(comment), key=str) == sorted(
        [
            (1, REPO / "deploy" / "README.md", "Redis: users"),
            (1, REPO / "contracts" / "CONTRACT.md", "Bounds"),
            (1, README, "Try it locally"),
            (2, REPO / "deploy" / "README.md", "Redis users"),
            (2, REPO / "contracts" / "typescript" / "README.md", "Testing your shard"),
            (2, "SPEC.md", "Ids"),
        ],
        key=str,
    )
