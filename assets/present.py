"""Phase 4, present: the operational picture (summary, GeoJSON, report) delivered to consumers."""


import json
from collections.abc import Iterator

import dagster as dg
import pyarrow as pa
from dagster import AssetExecutionContext

from assets.checks import Check
from assets.context import PhaseContext, PhaseOutput
from assets.materialize import TABLE_KINDS, asset_options, materialize_phase
from assets.phases import PRESENT
from assets.quality import Measures, Quality, grade_signal
from assets.schemas import REGION_DAY_SUMMARY
from resources.dagster_resources import LakeResource, LandingResource, PublisherResource
from resources.landing_layout import PARTITION_FILES, partition_file
from resources.ledger_resource import LedgerResource
from resources.publisher import Artifact


def compute(ctx: PhaseContext) -> PhaseOutput:
    from assets.transforms.present import render_artifacts, summarize
    part = ctx.partition
    t = ctx.read_inputs()
    enriched, cell_hour, cell_risk, clusters = (t["outages_enriched"], t["cell_hour_stats"], t["cell_risk"],
                                                t["storm_clusters"])
    customers = t["customers_ref"]
    quarantined = int(ctx.upstream["ingest"].summary["rows"]["quarantine"])
    quality = signal_quality(ctx, enriched)
    ctx.fault_point()
    summary = summarize(region=part.region, day=part.day, enriched=enriched, cell_hour=cell_hour,
                        cell_risk=cell_risk, clusters=clusters, customers=customers, quarantined_rows=quarantined,
                        signal_quality=quality.grade)
    rendered = render_artifacts(region=part.region, day=part.day, summary=summary, cell_hour=cell_hour,
                                cell_risk=cell_risk, clusters=clusters, enriched=enriched)
    artifacts = [Artifact(part.region.region_id, part.day, kind, rendered[kind]) for kind in sorted(rendered)]
    row = summary.iloc[0]
    return PhaseOutput(
        tables={"region_day_summary": pa.Table.from_pandas(summary, schema=REGION_DAY_SUMMARY, preserve_index=False)},
        figures={
            "outages": int(row["outages"]),
            "expected_outages": int(len(enriched)),
            "customers_out": int(row["customers_out"]),
            "clusters": int(row["clusters"]),
            "expected_clusters": int(len(clusters)),
            "backlog": int(row["backlog"]),
            "artifacts": {a.kind: a.artifact_id for a in artifacts},
            "quality": quality.as_json(),
        },
        artifacts=artifacts,
        hold={"quality": quality.grade, "reasons": list(quality.reasons)} if quality.held else None,
    )


def signal_quality(ctx: PhaseContext, enriched) -> Quality:
    """The batch's signal quality from what ingest and enrich measured (thresholds: :mod:`assets.quality`)."""
    # the batch's own files (outages, weather): the region-wide reference files are not the batch's
    part = ctx.partition
    own = {partition_file(part.region.region_id, part.day, name) for name in PARTITION_FILES}
    files = [f for f in ctx.upstream["ingest"].summary["figures"]["files"] if f["source_file"] in own]
    weather = ctx.upstream["enrich"].summary["figures"]["weather"]
    return grade_signal(Measures.of(
        rows_read=sum(f["rows_read"] - f["rows_other_regions"] for f in files),
        rows_quarantined=sum(f["rows_quarantined"] for f in files),
        outages=len(enriched),
        outages_with_reading=weather["outages_with_reading"],
        station_hours=weather["station_hours"],
        station_hours_observed=weather["station_hours_observed"],
        outages_without_feeder=int(enriched["feeder_id"].isna().sum()) if len(enriched) else 0,
    ))


def grade(ctx: PhaseContext, out: PhaseOutput) -> Iterator[Check]:
    f = out.figures
    yield Check("summary_outages", f["outages"] == f["expected_outages"], f"{f['outages']} vs {f['expected_outages']}")
    yield Check("summary_clusters", f["clusters"] == f["expected_clusters"], f"{f['clusters']} vs {f['expected_clusters']}")
    by_kind = {a.kind: a for a in out.artifacts}
    yield Check("artifacts", set(by_kind) == {"summary.json", "clusters.geojson", "report.html"}, ",".join(sorted(by_kind)))
    try:
        geo = json.loads(by_kind["clusters.geojson"].data)
        ok = geo.get("type") == "FeatureCollection" and len(geo.get("features", [])) == f["clusters"]
        yield Check("geojson", ok, f"{len(geo.get('features', []))} features")
        json.loads(by_kind["summary.json"].data)
        yield Check("summary_json", True, "parses")
    except (KeyError, ValueError) as exc:
        yield Check("artifacts_parse", False, str(exc))
    q = f["quality"]
    yield Check("signal_quality", True, f"{q['grade']}: " + ("; ".join(q["reasons"]) or "every measure within the high limits"))
    html = by_kind.get("report.html")
    pictures = html.data.count(b"<svg ") if html is not None else 0
    yield Check("report_picture", pictures >= 1, f"report has {pictures} pictures")


@dg.multi_asset(**asset_options(PRESENT, kinds={*TABLE_KINDS, "html"}))
def operational_picture(context: AssetExecutionContext, ledger: LedgerResource, lake: LakeResource,
                        landing: LandingResource, publisher: PublisherResource):
    """The region-day's summary, cluster GeoJSON and illustrated report, delivered once to every target."""
    yield from materialize_phase(context, PRESENT, compute, grade, ledger=ledger, lake=lake, landing=landing,
                                 publisher=publisher)
