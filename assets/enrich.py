"""Phase 2, enrich: outages joined with customers, terrain and weather on the H3 grid."""


from collections.abc import Iterator

import dagster as dg
import pyarrow as pa
from dagster import AssetExecutionContext

from assets.checks import Check
from assets.context import PhaseContext, PhaseOutput
from assets.materialize import asset_options, materialize_phase
from assets.phases import ENRICH
from assets.schemas import OUTAGES_ENRICHED
from resources.dagster_resources import LakeResource, LandingResource, PublisherResource
from resources.ledger_resource import LedgerResource


def compute(ctx: PhaseContext) -> PhaseOutput:
    from assets.transforms.enrich import enrich_partition
    part = ctx.partition
    t = ctx.read_inputs()
    outages = t["outages_raw"]
    ctx.fault_point()
    enriched, coverage = enrich_partition(outages, t["weather_raw"], t["customers_ref"], t["terrain_ref"],
                                          region=part.region, day=part.day)
    table = pa.Table.from_pandas(enriched, schema=OUTAGES_ENRICHED, preserve_index=False)
    return PhaseOutput(
        tables={"outages_enriched": table},
        figures={
            "outages": table.num_rows,
            "input_outages": len(outages),
            "cells": int(enriched["cell_id"].nunique()) if len(enriched) else 0,
            "customers_out": int(enriched["customers_out"].sum()) if len(enriched) else 0,
            "weather": coverage,  # graded by present (assets.quality)
        },
    )


def grade(ctx: PhaseContext, out: PhaseOutput) -> Iterator[Check]:
    f = out.figures
    yield Check("one_row_per_outage", f["outages"] == f["input_outages"],
                f"{f['outages']} enriched rows for {f['input_outages']} ingested outages")
    t = out.tables["outages_enriched"]
    hours = t.column("hour").to_numpy(zero_copy_only=False) if t.num_rows else []
    yield Check("hour_range", bool(len(hours) == 0 or (hours.min() >= 0 and hours.max() <= 23)), "hour in 0..23")


@dg.multi_asset(**asset_options(ENRICH))
def enriched_outages(context: AssetExecutionContext, ledger: LedgerResource, lake: LakeResource,
                     landing: LandingResource, publisher: PublisherResource):
    """Outages on the H3 resolution-7 grid with the cell's customers, feeder, terrain and weather."""
    yield from materialize_phase(context, ENRICH, compute, grade, ledger=ledger, lake=lake, landing=landing,
                                 publisher=publisher)
