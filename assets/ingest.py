"""Phase 1, ingest: landing files → validated Delta tables, bad rows quarantined."""


from collections.abc import Iterator
from dataclasses import asdict

import dagster as dg
from dagster import AssetExecutionContext

from assets.checks import Check
from assets.context import PhaseContext, PhaseOutput
from assets.landing_files import landing_files
from assets.materialize import asset_options, materialize_phase
from assets.phases import INGEST
from resources.dagster_resources import LakeResource, LandingResource, PublisherResource
from resources.ledger_resource import LedgerResource


def compute(ctx: PhaseContext) -> PhaseOutput:
    from assets.transforms.ingest import ingest_partition
    part = ctx.partition
    result = ingest_partition(ctx.landing.storage, part.region, part.day, known_regions=ctx.known_regions)
    ctx.fault_point()
    files = [asdict(f) for f in result.files]
    return PhaseOutput(
        tables={
            "outages_raw": result.outages,
            "weather_raw": result.weather,
            "customers_ref": result.customers,
            "terrain_ref": result.terrain,
            "quarantine": result.quarantine,
        },
        figures={
            "files": files,
            "outages": result.outages.num_rows,
            "weather": result.weather.num_rows,
            "quarantined": result.quarantine.num_rows,
        },
    )


def grade(ctx: PhaseContext, out: PhaseOutput) -> Iterator[Check]:
    files = out.figures["files"]
    for f in files:
        conserved = f["rows_read"] == f["rows_accepted"] + f["rows_quarantined"] + f["rows_other_regions"]
        yield Check(f"conserved:{f['source_file']}", conserved,
                    f"read {f['rows_read']} = accepted {f['rows_accepted']} + quarantined {f['rows_quarantined']}"
                    f" + other regions {f['rows_other_regions']}")
    q = sum(f["rows_quarantined"] for f in files)
    yield Check("quarantine_rows", q == out.tables["quarantine"].num_rows,
                f"{q} quarantined in file reports, {out.tables['quarantine'].num_rows} rows in quarantine")


@dg.multi_asset(**asset_options(INGEST, deps=[landing_files]))
def ingested_batch(context: AssetExecutionContext, ledger: LedgerResource, lake: LakeResource,
                   landing: LandingResource, publisher: PublisherResource):
    """The batch's landing files validated into Delta tables (outages, weather, reference), bad rows quarantined."""
    yield from materialize_phase(context, INGEST, compute, grade, ledger=ledger, lake=lake, landing=landing,
                                 publisher=publisher)
