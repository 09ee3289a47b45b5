"""A job of one asset that does nothing, for tests that need real runs in a Dagster instance
(their status, tags, pools) without stormlake's code location."""

from __future__ import annotations

import dagster as dg


def one_asset_job() -> dg.JobDefinition:
    @dg.asset
    def one() -> None:
        return None

    return dg.Definitions(assets=[one], jobs=[dg.define_asset_job("j")]).resolve_job_def("j")
