"""What a new checkout installs is the set the tests run on: exact pins, a lock with hashes, and
`make` installing from that lock."""

from __future__ import annotations

import re
import subprocess
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements.lock"


def _pins() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["dev"]]]


def _locked() -> dict[str, tuple[str, Marker | None, list[str]]]:
    """name -> (version, marker, hashes) of every package in the lock."""
    text = LOCK.read_text().replace("\\\n", " ")
    out: dict[str, tuple[str, Marker | None, list[str]]] = {}
    for line in text.splitlines():
        if not line or line[0] in "# ":
            continue
        spec, _, rest = line.partition(" --hash")
        req = Requirement(spec.strip())
        (pin,) = req.specifier
        out[canonicalize_name(req.name)] = (pin.version, req.marker, re.findall(r"sha256:([0-9a-f]{64})", line))
    return out


def test_every_direct_dependency_is_pinned_exactly_and_locked_at_that_version() -> None:
    locked = _locked()
    for req in _pins():
        (pin,) = req.specifier
        assert pin.operator == "==" and "*" not in pin.version, f"{req} is not an exact pin"
        assert locked[canonicalize_name(req.name)][0] == pin.version, f"{req}: requirements.lock differs; run make lock"


def test_every_locked_package_has_hashes_and_is_what_this_environment_runs() -> None:
    locked = _locked()
    assert len(locked) > 50  # the whole tree, not just the direct pins
    for name, (ver, marker, hashes) in locked.items():
        assert hashes, f"{name} has no hash in requirements.lock"
        if marker is not None and not marker.evaluate():
            continue  # another platform's package
        try:
            installed = version(name)
        except PackageNotFoundError:
            raise AssertionError(f"{name}=={ver} is locked but not installed; run make") from None
        assert installed == ver, f"{name}: {installed} installed, {ver} locked; run make"


def test_make_installs_the_lock_with_hashes_then_the_project_without_dependencies() -> None:
    plan = subprocess.run(["make", "-n", "-B", ".venv/.installed"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout
    installs = [ln for ln in plan.splitlines() if " pip install " in ln]
    assert [("--require-hashes -r requirements.lock" in ln, "--no-deps -e ." in ln) for ln in installs[-2:]] == [
        (True, False), (False, True)], plan
    lock_plan = subprocess.run(["make", "-n", "lock"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "uv pip compile pyproject.toml --extra dev --universal --generate-hashes" in lock_plan, lock_plan
