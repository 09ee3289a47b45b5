"""The allocator settings every stormlake process applies when it imports ``pipeline``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = "import pipeline, resources.memory as m; print(m._DONE)"


def _probe(env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_importing_pipeline_keeps_freed_memory_unless_the_environment_says_otherwise() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    assert _probe(env) == "[True]"
    assert _probe({**env, "MALLOC_TRIM_THRESHOLD_": "131072"}) == "[False]"  # the operator's own setting wins
