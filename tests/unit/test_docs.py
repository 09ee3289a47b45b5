"""The project's documents: every link between them leads to a file (and heading) in the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.conftest import REPO

README_MAX_LINES = 300
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _documents() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    return [REPO / p for p in out.split()]


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens.

    Example:
        >>> _anchor("`stormlake status --json`")
        'stormlake-status---json'
    """
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    text = _FENCE.sub("", doc.read_text(encoding="utf-8"))
    return {_anchor(m) for m in re.findall(r"^#+\s+(.*)$", text, re.M)}


def broken_links(doc: Path, root: Path = REPO) -> list[str]:
    """Links of ``doc`` to a path outside ``root``, a missing file or a missing heading."""
    broken = []
    for target in _LINK.findall(_FENCE.sub("", doc.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue  # a web address: not a document of the repository
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        missing = not dest.is_relative_to(root.resolve()) or not dest.exists()
        if missing or (anchor and dest.suffix == ".md" and anchor not in _anchors(dest)):
            broken.append(target)
    return broken


def test_anchor_example() -> None:
    import doctest
    import sys

    assert doctest.testmod(sys.modules[__name__]).failed == 0


def test_every_link_of_every_document_is_in_the_repository() -> None:
    broken = {str(d.relative_to(REPO)): b for d in _documents() if (b := broken_links(d))}
    assert not broken, f"links to nothing in the repository: {broken}"


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "A.md").write_text("# A\n\n## How it `works`\n", encoding="utf-8")
    (tmp_path / "outside.md").write_text("# Outside\n", encoding="utf-8")
    doc = root / "README.md"
    doc.write_text(
        "# R\n[ok](docs/A.md#how-it-works) [top](#r) [web](https://example.org)\n"
        "[gone](docs/B.md) [heading](docs/A.md#nothing) [out](../outside.md) [here](#none)\n"
        "```\n[in a fence](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(doc, root) == ["docs/B.md", "docs/A.md#nothing", "../outside.md", "#none"]


def test_readme_is_a_reference_a_newcomer_reads_in_ten_minutes() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md is {lines} lines; details go to docs/"
