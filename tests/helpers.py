"""Test helpers: run phases with the real resources, read tables, compare lakes."""

from __future__ import annotations

from typing import Any

import dagster as dg
import pandas as pd
from deltalake import DeltaTable

from assets.schemas import PARTITION_COLUMNS, SCHEMAS
from pipeline.definitions import PHASE_ASSETS, build_resources
from resources.lake import Lake

KEY = "2026-09-01|gulf_coast"


def materialize(key: str = KEY, *, selection: list[Any] | None = None, raise_on_error: bool = False,
                instance: dg.DagsterInstance | None = None,
                tags: dict[str, str] | None = None) -> dg.ExecuteInProcessResult:
    """Materialize the phase assets (their tables) for one partition with resources built from the environment."""
    return dg.materialize(
        PHASE_ASSETS,
        selection=selection,
        partition_key=key,
        resources=build_resources(),
        instance=instance,
        raise_on_error=raise_on_error,
        tags=tags,
    )


def lake(root: str) -> Lake:
    return Lake(root, SCHEMAS, partition_by=PARTITION_COLUMNS)


def latest_version(lk: Lake, table: str) -> int | None:
    """The table's newest version, None before it exists."""
    if not DeltaTable.is_deltatable(lk.uri(table)):
        return None
    return lk.table(table).version()


def read_table(root: str, table: str, key: str = KEY) -> pd.DataFrame:
    """The current contents of one partition of a table, sorted for comparison."""
    day, _, region = key.partition("|")
    lk = lake(root)
    version = latest_version(lk, table)
    if version is None:
        return pd.DataFrame()
    df = lk.read_partition(table, region, day, version=version).to_pandas()
    if not len(df):
        return df
    cols = [c for c in df.columns if not df[c].map(lambda v: isinstance(v, list | tuple) or hasattr(v, "tolist")).any()]
    return df.sort_values(cols).reset_index(drop=True)


def table_versions(root: str) -> dict[str, int | None]:
    lk = lake(root)
    return {t: latest_version(lk, t) for t in SCHEMAS}


def step_outcomes(result: dg.ExecuteInProcessResult) -> dict[str, str]:
    """Phase op (step) name -> the status metadata (COMPLETED / SKIPPED) of its materializations.

    Every table of a phase carries the phase's outcome, so they must agree, and a phase that
    materialized some of its tables must have materialized all of them.
    """
    from assets.phases import BY_NAME, TABLE_PHASE

    by_phase: dict[str, dict[str, str]] = {}
    for ev in result.get_asset_materialization_events():
        mat = ev.step_materialization_data.materialization
        table = mat.asset_key.to_user_string()
        by_phase.setdefault(TABLE_PHASE[table], {})[table] = mat.metadata["status"].value
    out = {}
    for name, statuses in by_phase.items():
        phase = BY_NAME[name]
        assert set(statuses) == set(phase.tables), f"{name} materialized {sorted(statuses)} of {phase.tables}"
        assert len(set(statuses.values())) == 1, f"{name}: its tables disagree: {statuses}"
        out[phase.asset] = next(iter(statuses.values()))
    return out


def requested_keys(request: dg.RunRequest) -> list[str]:
    """The partitions a run request asks for: its key range, or its one partition."""
    from assets.partitions import PARTITIONS
    from resources.keys import RANGE_END_TAG, RANGE_START_TAG

    start, end = request.tags.get(RANGE_START_TAG), request.tags.get(RANGE_END_TAG)
    if start and end:
        return [str(k) for k in PARTITIONS.get_partition_keys_in_range(dg.PartitionKeyRange(start, end))]
    return [str(request.partition_key)]
