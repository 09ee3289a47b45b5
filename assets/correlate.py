"""Phase 3, correlate: outages against the storm per cell and hour, damage clusters, risk."""


from collections.abc import Iterator

import dagster as dg
import pyarrow as pa
from dagster import AssetExecutionContext

from assets.checks import Check
from assets.context import PhaseContext, PhaseOutput
from assets.materialize import asset_options, materialize_phase
from assets.phases import CORRELATE
from assets.schemas import CELL_HOUR_STATS, CELL_RISK, STORM_CLUSTERS
from resources.dagster_resources import LakeResource, LandingResource, PublisherResource
from resources.ledger_resource import LedgerResource


def compute(ctx: PhaseContext) -> PhaseOutput:
    from assets.transforms.correlate import correlate_storm
    part = ctx.partition
    t = ctx.read_inputs()
    ctx.fault_point()
    cell_hour, cell_risk, clusters = correlate_storm(t["outages_enriched"], t["weather_raw"], t["customers_ref"],
                                                     t["terrain_ref"], region=part.region, day=part.day)
    tables = {
        "cell_hour_stats": pa.Table.from_pandas(cell_hour, schema=CELL_HOUR_STATS, preserve_index=False),
        "cell_risk": pa.Table.from_pandas(cell_risk, schema=CELL_RISK, preserve_index=False),
        "storm_clusters": pa.Table.from_pandas(clusters, schema=STORM_CLUSTERS, preserve_index=False),
    }
    return PhaseOutput(
        tables=tables,
        figures={
            "outages": int(len(t["outages_enriched"])),
            "cell_hours": tables["cell_hour_stats"].num_rows,
            "cells": tables["cell_risk"].num_rows,
            "clusters": tables["storm_clusters"].num_rows,
            "clustered_outages": int(clusters["outages"].sum()) if len(clusters) else 0,
            "max_risk": float(cell_risk["risk"].max()) if len(cell_risk) else 0.0,
            "cell_hour_outages": int(cell_hour["outages"].sum()) if len(cell_hour) else 0,
        },
    )


def grade(ctx: PhaseContext, out: PhaseOutput) -> Iterator[Check]:
    f = out.figures
    yield Check("cell_hours_cover_outages", f["cell_hour_outages"] == f["outages"],
                f"{f['cell_hour_outages']} outages in cell-hours, {f['outages']} enriched")
    risk = out.tables["cell_risk"].column("risk").to_numpy(zero_copy_only=False)
    yield Check("risk_range", bool(len(risk) == 0 or (risk.min() >= 0 and risk.max() <= 1)), "risk in [0, 1]")
    clusters = out.tables["storm_clusters"].to_pydict()
    risk_cells = set(out.tables["cell_risk"].column("cell_id").to_pylist())
    members = [c for cells in clusters["cell_ids"] for c in cells]
    yield Check("clusters_disjoint", len(members) == len(set(members)), "no cell in two clusters")
    yield Check("cluster_cells_known", set(members) <= risk_cells, "every cluster cell has a risk row")


@dg.multi_asset(**asset_options(CORRELATE))
def storm_correlation(context: AssetExecutionContext, ledger: LedgerResource, lake: LakeResource,
                      landing: LandingResource, publisher: PublisherResource):
    """Outages against gust and rain per cell-hour, a risk figure per cell, and damage clusters."""
    yield from materialize_phase(context, CORRELATE, compute, grade, ledger=ledger, lake=lake, landing=landing,
                                 publisher=publisher)
