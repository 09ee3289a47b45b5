"""Every non-public Dagster symbol the project's code uses, and where.

Non-public means: a name imported from a module under ``dagster._`` (or ``dagster_postgres._``,
``dagster_graphql._``) or an underscore name imported from a Dagster package; an underscore
attribute that Dagster defines (read on one of its objects); a method or property of
``DagsterInstance`` that Dagster does not mark public (its ``@public`` marker is what its API
reference lists), called on an instance; any method of an instance's storages. The project's code
is ``pipeline``, ``assets`` and ``resources``; the tests may look inside Dagster to check it.

The rule (TEAM.md, issue 36) is that they all live in ``resources/dagster_compat.py``. It does not
hold yet: :data:`OUTSIDE_COMPAT` lists the uses elsewhere. A new use outside the module fails
:func:`test_no_new_non_public_dagster_use_outside_the_compat_module`; when the list is empty,
:func:`test_every_non_public_dagster_symbol_lives_in_the_compat_module` passes, and its xfail
mark goes.
"""

from __future__ import annotations

import ast
import inspect
import re
from functools import cache
from pathlib import Path

import dagster as dg
import pytest
from dagster._annotations import is_public

REPO = Path(__file__).resolve().parents[2]
COMPAT = "resources/dagster_compat.py"
PACKAGES = ("dagster", "dagster_postgres", "dagster_graphql", "dagster_webserver", "dagster_dg_cli")

#: symbol -> the files outside the compat module that use it, today.
OUTSIDE_COMPAT: dict[str, set[str]] = {
    "dagster._core.launcher.CheckRunHealthResult": {"pipeline/launcher.py"},
    "dagster._core.launcher.LaunchRunContext": {"pipeline/launcher.py"},
    "dagster._core.launcher.RunLauncher": {"pipeline/launcher.py"},
    "dagster._core.launcher.WorkerStatus": {"pipeline/launcher.py"},
    "dagster._serdes.ConfigurableClass": {"pipeline/launcher.py"},
    "dagster._serdes.ConfigurableClassData": {"pipeline/launcher.py"},
    "._instance": {"pipeline/launcher.py"},
    "DagsterInstance.add_run_tags": {"assets/materialize.py", "pipeline/launcher.py", "pipeline/range_runs.py"},
    "DagsterInstance.get_run_group": {"assets/materialize.py", "pipeline/range_runs.py"},
    "DagsterInstance.launch_run": {"pipeline/launcher.py"},
    "DagsterInstance.report_engine_event": {"pipeline/launcher.py", "pipeline/range_runs.py"},
    "DagsterInstance.report_run_canceling": {"pipeline/launcher.py"},
    "DagsterInstance.report_run_failed": {"pipeline/launcher.py"},
    "DagsterInstance.run_launcher": {"pipeline/launcher.py"},
    "DagsterInstance.run_retries_max_retries": {"pipeline/range_runs.py"},
}


def _files() -> dict[str, ast.Module]:
    paths = [p for d in ("pipeline", "assets", "resources") for p in sorted((REPO / d).rglob("*.py"))]
    return {str(p.relative_to(REPO)): ast.parse(p.read_text(), str(p)) for p in paths}


def _own_names(trees: dict[str, ast.Module]) -> set[str]:
    """Every name the project defines itself: its attributes are its own, not Dagster's."""
    names: set[str] = set()
    for tree in trees.values():
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(n.name)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                names.add(n.attr)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names.add(n.id)
            elif isinstance(n, ast.arg):
                names.add(n.arg)
    return names


@cache
def _dagster_source() -> str:
    return "\n".join(p.read_text(errors="ignore") for p in Path(dg.__file__).parent.rglob("*.py"))


def _defined_by_dagster(name: str) -> bool:
    return re.search(rf"(def {name}\b|self\.{name}\b|^\s*{name}\s*[:=])", _dagster_source(), re.M) is not None


def _receiver(node: ast.expr) -> str:
    while isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _instance_member_is_public(name: str) -> bool | None:
    """None when ``DagsterInstance`` has no such member."""
    raw = inspect.getattr_static(dg.DagsterInstance, name, None)
    if raw is None:
        return None
    return is_public(raw) or is_public(raw.fget if isinstance(raw, property) else raw)


def non_public_uses() -> dict[str, set[str]]:
    """symbol -> files of the project's code that use it."""
    trees = _files()
    own = _own_names(trees)
    uses: dict[str, set[str]] = {}
    for rel, tree in trees.items():
        for n in ast.walk(tree):
            found: list[str] = []
            if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] in PACKAGES:
                private_module = any(part.startswith("_") for part in n.module.split("."))
                found += [f"{n.module}.{a.name}" for a in n.names if private_module or a.name.startswith("_")]
            elif isinstance(n, ast.Import):
                found += [a.name for a in n.names if a.name.split(".")[0] in PACKAGES
                          and any(part.startswith("_") for part in a.name.split("."))]
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and not n.attr.startswith("__"):
                receiver = _receiver(n.value)
                if n.attr.startswith("_") and n.attr not in own and _defined_by_dagster(n.attr):
                    found.append(f".{n.attr}")
                elif receiver.endswith("_storage") and not isinstance(n.value, ast.Call):  # not open_storage(...)
                    found.append(f"DagsterInstance.{receiver}.{n.attr}")
                elif "instance" in receiver.lower() and _instance_member_is_public(n.attr) is False:
                    found.append(f"DagsterInstance.{n.attr}")
            for symbol in found:
                uses.setdefault(symbol, set()).add(rel)
    return uses


def _outside_compat() -> dict[str, set[str]]:
    return {s: files - {COMPAT} for s, files in non_public_uses().items() if files - {COMPAT}}


def test_the_inventory_finds_what_issue_36_names() -> None:
    """The scan sees the kinds of use the issue lists, wherever they are today."""
    uses = non_public_uses()
    assert any(s.startswith("dagster._core.") for s in uses)
    assert any(s.startswith("DagsterInstance.event_log_storage.") for s in uses)
    assert any(s.startswith("._") for s in uses)
    assert {"DagsterInstance.report_run_failed", "DagsterInstance.report_dagster_event"} <= set(uses)
    assert _instance_member_is_public("get_run_by_id") is True  # a public member is not counted
    assert _instance_member_is_public("add_run_tags") is False


def test_no_new_non_public_dagster_use_outside_the_compat_module() -> None:
    new = {s: sorted(files - OUTSIDE_COMPAT.get(s, set())) for s, files in _outside_compat().items()
           if files - OUTSIDE_COMPAT.get(s, set())}
    assert not new, f"non-public Dagster symbols used outside {COMPAT}: {new}; put them behind a function there"


@pytest.mark.xfail(strict=True, reason="issue 36: launcher, range_runs and materialize still use non-public "
                                       "Dagster symbols (OUTSIDE_COMPAT); when none do, remove this mark")
def test_every_non_public_dagster_symbol_lives_in_the_compat_module() -> None:
    assert _outside_compat() == {}
