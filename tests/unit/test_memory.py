"""The allocator settings a process applies before its first phase."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = ("import gc, resources.memory as m; from assets.runner import prepare_process; "
         "before = gc.get_freeze_count(); print(m.keep_freed_memory(), before == 0); "
         "prepare_process(); frozen = gc.get_freeze_count(); prepare_process(); "
         "print(frozen > 0, gc.get_freeze_count() == frozen)")


def _probe(env: dict[str, str]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_phase_process_keeps_freed_memory_unless_the_environment_says_otherwise() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    # Importing the code changes nothing; the runner freezes the start-up heap once, not per phase.
    assert _probe(env) == ["True", "True", "True", "True"]
    assert _probe({**env, "MALLOC_TRIM_THRESHOLD_": "131072"})[0] == "False"  # the operator's own setting wins
