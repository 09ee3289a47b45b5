"""The shape of the road to the phases: the execution side stays small, and neither the phases nor
the road knows of a screen (progress is read from the ledger and the instance)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What starts, watches and reaches Dagster for a partition: the command line, the backfill it
#: submits and watches, and the one module of Dagster's non-public symbols.
EXECUTION_SIDE = ("pipeline/cli.py", "pipeline/backfill.py", "resources/dagster_compat.py")
MOST_LINES = 1_400
#: The modules that only the command line may import: what draws on a terminal.
SCREEN = ("pipeline.progress", "pipeline.console", "pipeline.cli")


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, and each name it imports from one (``module.name``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_the_execution_side_is_at_most_1400_lines() -> None:
    lines = {name: len((ROOT / name).read_text(encoding="utf-8").splitlines()) for name in EXECUTION_SIDE}
    assert sum(lines.values()) <= MOST_LINES, lines


def test_the_phases_and_the_road_import_no_screen() -> None:
    road = [*sorted((ROOT / "assets").glob("*.py")), *sorted((ROOT / "resources").glob("*.py")),
            ROOT / "pipeline/preflight.py", ROOT / "pipeline/definitions.py", ROOT / "pipeline/sensors.py"]
    found = {str(p.relative_to(ROOT)): sorted(m for m in _imports(p) if m.startswith(SCREEN)) for p in road}
    assert not {p: m for p, m in found.items() if m}


#: The one module of ``assets`` that is no phase and reaches compat: the landing zone's source
#: asset, whose observations the sensor and the CLI report outside an observation function and
#: whose versions are read back from them (Dagster's data version tag; compat says why).
#: Dagster's private modules are compat's alone (tests/unit/test_public_api.py).
NOT_A_PHASE = {"assets/landing_files.py"}
COMPAT = "resources.dagster_compat"


def test_the_phases_use_public_dagster_only() -> None:
    modules = {str(p.relative_to(ROOT)): p for p in sorted((ROOT / "assets").glob("*.py"))}
    found = {name: sorted(m for m in _imports(p) if m.startswith(COMPAT)) for name, p in modules.items()}
    assert not {p: m for p, m in found.items() if m and p not in NOT_A_PHASE}
    assert all(found[name] for name in NOT_A_PHASE), "no exception is needed any more"


def test_loading_the_definitions_leaves_the_transforms_libraries_to_the_steps() -> None:
    """A code server, the CLI's backfill and ``dagster asset materialize`` load the definitions
    without running a phase: pandas, h3 and the transforms wait for a step (each phase's asset
    imports its transform before its first claim)."""
    import subprocess
    import sys

    code = ("import sys, pipeline.definitions;"
            " print(sorted(m for m in ('pandas', 'h3', 'matplotlib', 'assets.transforms.ingest',"
            " 'assets.transforms.enrich', 'assets.transforms.correlate', 'assets.transforms.present')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
