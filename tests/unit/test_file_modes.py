"""What stormlake writes is its user's alone by default (0600 files, 0700 folders), its group's too
with ``STORMLAKE_FILE_MODE=group``: landing zones it generates, the lake's Delta files, artifacts."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from resources.errors import ConfigError
from resources.settings import load_settings

STORMLAKE = Path(sys.executable).parent / "stormlake"
LAKE_WRITE = """
import pyarrow as pa
from resources.files import apply_file_mode, write_atomic
from resources.lake import Lake
from resources.settings import load_settings
apply_file_mode(load_settings().file_mode)
schema = pa.schema([("region_id", pa.string()), ("day", pa.string()), ("x", pa.int64())])
lake = Lake({root!r}, {{"t": schema}}, partition_by=["region_id", "day"])
lake.overwrite_partition("t", "r", "2026-09-01",
                         pa.table({{"region_id": ["r"], "day": ["2026-09-01"], "x": [1]}}, schema=schema),
                         seq=1, first_seq=1, keep=False)
write_atomic({artifact!r}, "<html></html>", durable=True)
"""


def _modes(root: Path) -> tuple[set[int], set[int]]:
    files, folders = set(), set()
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        (folders if path.is_dir() else files).add(mode)
    return files, folders


@pytest.mark.parametrize(("setting", "file_mode", "folder_mode"), [(None, 0o600, 0o700), ("group", 0o640, 0o750)])
def test_generated_landing_files_the_lake_and_artifacts_follow_the_file_mode(tmp_path: Path, setting: str | None,
                                                                             file_mode: int, folder_mode: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STORMLAKE_")}
    env["STORMLAKE_HOME"] = str(tmp_path / "home")
    if setting:
        env["STORMLAKE_FILE_MODE"] = setting
    gen = subprocess.run([str(STORMLAKE), "generate", "--regions", "1", "--days", "1", "--rows-per-partition", "20"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert gen.returncode == 0, gen.stderr
    assert _modes(tmp_path / "home" / "landing") == ({file_mode}, {folder_mode})

    lake, artifact = tmp_path / "home" / "lake", tmp_path / "home" / "published" / "r" / "report.html"
    code = LAKE_WRITE.format(root=str(lake), artifact=str(artifact))
    write = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert write.returncode == 0, write.stderr[-2000:]
    assert _modes(lake) == ({file_mode}, {folder_mode})
    assert _modes(artifact.parent) == ({file_mode}, {folder_mode})


def test_a_file_mode_that_is_not_known_is_a_usage_error() -> None:
    with pytest.raises(ConfigError, match="STORMLAKE_FILE_MODE='world'"):
        load_settings({"STORMLAKE_FILE_MODE": "world"})
