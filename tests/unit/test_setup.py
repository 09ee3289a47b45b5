"""The two commands of the README are the whole set-up: CI adds nothing of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _commands(path: Path) -> list[str]:
    lines = [ln.strip() for ln in path.read_text().splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


def test_ci_runs_make_test_and_nothing_else() -> None:
    commands = _commands(REPO / ".ci" / "run")
    assert commands == ["set -euo pipefail", 'cd "$(dirname "$0")/.."',
                        'make test PYTEST_ARGS="-q -p no:cacheprovider"'], commands


def test_make_test_installs_the_browser_before_the_tests() -> None:
    plan = subprocess.run(["make", "-n", "test"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    steps = plan.splitlines()
    browser = next(i for i, s in enumerate(steps) if "ensure_browser.sh" in s)
    pytest = next(i for i, s in enumerate(steps) if "pytest" in s)
    assert browser < pytest, plan


def test_a_missing_browser_is_named_in_one_line(tmp_path: Path) -> None:
    """Without Chromium and without the right to install it: one line naming the package and command."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("bash", "id", "env"):
        found = shutil.which(tool)
        assert found
        (bindir / tool).symlink_to(found)
    env = {"PATH": str(bindir), "STORMLAKE_NO_INSTALL": "1", "HOME": os.environ.get("HOME", "/tmp")}
    res = subprocess.run([str(bindir / "bash"), str(REPO / "tests" / "ensure_browser.sh")], env=env,
                         capture_output=True, text=True)
    assert res.returncode == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "apt-get install -y chromium" in lines[0], res.stderr
