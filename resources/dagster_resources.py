"""The lake, the landing zone and the delivery targets as Dagster resources.

Kept apart from :mod:`resources.lake`, :mod:`resources.landing` and :mod:`resources.publisher`
(as :class:`resources.ledger_resource.LedgerResource` is from the ledger), so that the code
that works on them without Dagster (the CLI's preflight, the views, the bench's bare loop) does
not import Dagster.
"""

from __future__ import annotations

import dagster as dg
import pyarrow as pa
from pydantic import PrivateAttr

from resources.lake import Lake
from resources.landing import Landing
from resources.publisher import Target, build_targets
from resources.settings import DEFAULT_LAKE_LOG_RETENTION_MINUTES


class LakeResource(dg.ConfigurableResource):
    """The lake root (``STORMLAKE_LAKE``); ``get`` binds it to the tables' schemas."""

    root: str
    #: ``STORMLAKE_LAKE_LOG_RETENTION_MINUTES``: how long a table's Delta log keeps older commits.
    log_retention_minutes: int = DEFAULT_LAKE_LOG_RETENTION_MINUTES

    def get(self, schemas: dict[str, pa.Schema], *, partition_by: list[str]) -> Lake:
        return Lake(self.root, schemas, partition_by=partition_by, log_retention_minutes=self.log_retention_minutes)


class LandingResource(dg.ConfigurableResource):
    """The landing zone (``STORMLAKE_LANDING``) and the region list it is read with."""

    root: str
    regions_file: str
    _landing: Landing | None = PrivateAttr(default=None)

    def get(self) -> Landing:
        """The landing zone: the same :class:`Landing` on every call, so its digests are computed once.

        Dagster initializes a resource per step (and per sensor tick): the digests are shared by
        everything in it, such as every partition of a range step.
        """
        if self._landing is None:
            self._landing = Landing(self.root)
        return self._landing

    def regions(self):  # -> dict[str, Region]
        from resources.settings import load_regions

        return {r.region_id: r for r in load_regions(self.regions_file)}


class PublisherResource(dg.ConfigurableResource):
    """Delivery targets: the publish directory, and the webhook when its URL is set."""

    publish_dir: str
    webhook_url: str = ""
    webhook_timeout_s: float = 10.0
    webhook_tries: int = 5
    webhook_backoff_s: float = 0.5

    def targets(self) -> list[Target]:
        return build_targets(self.publish_dir, self.webhook_url or None, timeout_s=self.webhook_timeout_s,
                             max_tries=self.webhook_tries, backoff_s=self.webhook_backoff_s)
