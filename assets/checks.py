"""What a phase's grader finds, and the schema checks every phase's output passes before it is written."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from assets.schemas import PARTITION_COLUMNS, SCHEMAS

if TYPE_CHECKING:
    from assets.context import PhaseOutput
    from assets.phases import Phase


@dataclass(frozen=True)
class Check:
    """One grader finding; a phase commits only when every check passed."""

    name: str
    passed: bool
    detail: str = ""



def schema_checks(phase: Phase, out: PhaseOutput) -> Iterable[Check]:
    """Every table a phase hands on has exactly its declared columns, types and partition."""
    for table in phase.tables:
        data = out.tables.get(table)
        if data is None:
            yield Check(f"{table}.present", False, "the phase produced no such table")
            continue
        schema = SCHEMAS[table]
        missing = [n for n in schema.names if n not in data.schema.names]
        if missing:
            yield Check(f"{table}.columns", False, f"missing column(s) {', '.join(missing)}")
            continue
        try:
            cast = data.select(schema.names).cast(schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as exc:
            yield Check(f"{table}.types", False, str(exc).splitlines()[0])
            continue
        bad_nulls = [f.name for f in schema if not f.nullable and cast.column(f.name).null_count]
        if bad_nulls:
            yield Check(f"{table}.nulls", False, f"nulls in non-nullable column(s) {', '.join(bad_nulls)}")
        yield Check(f"{table}.schema", not bad_nulls, f"{cast.num_rows} rows")
        for col in PARTITION_COLUMNS:
            values = set(cast.column(col).unique().to_pylist())
            if len(values) > 1:
                yield Check(f"{table}.{col}", False, f"rows of several partitions: {sorted(values)[:3]}")
        out.tables[table] = cast
