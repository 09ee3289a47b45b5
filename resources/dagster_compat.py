"""Every non-public Dagster symbol stormlake uses, in one module.

Outside this module, ``assets``, ``pipeline`` and ``resources`` use Dagster's public API only:
``import dagster as dg``, the documented ``dagster.yaml`` keys and the ``dg``/``dagster``
commands. ``tests/unit/test_public_api.py`` lists the symbols used here, exactly.

Each function has no public route in Dagster 1.13 (dagster-postgres 0.29); its docstring says
why stormlake needs it and names the upstream issue or pull request it waits for:

- :func:`data_version_tag`: the tag an observation of ``landing_files`` made outside an
  observation function carries its data version under (no parameter on ``dg.AssetObservation``;
  the REST endpoint has one, dagster-io/dagster#33919).
- :func:`launch_backfill`: an asset backfill of exactly the selected partitions, added to the
  instance for its daemon (``PartitionBackfill``, ``Definitions.resolve_asset_graph``,
  ``DagsterInstance.add_backfill``; the public route is GraphQL's ``launchPartitionBackfill``,
  which needs a webserver; a Python API was proposed in dagster-io/dagster#26731).
- :func:`backfill_status`: whether the backfill daemon is done with a backfill
  (``DagsterInstance.get_backfill``; the public route is GraphQL's ``partitionBackfillOrError``).

``tests/integration/test_dagster_compat.py`` checks each of them against a real instance on
PostgreSQL and names the symbol that moved when a Dagster upgrade breaks one: after an upgrade,
run that test first. The module depends on Dagster only, so every floor may import it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

# Dagster is imported inside the functions: importing this module costs nothing to a command
# that never builds a Dagster instance.
if TYPE_CHECKING:
    import dagster as dg


def data_version_tag() -> str:
    """The tag an asset observation carries its data version under.

    Dagster's staleness reads an observation's data version from this tag
    (``dagster._core.definitions.data_version.DATA_VERSION_TAG``, not exported). stormlake
    observes ``landing_files`` outside an observation function: the landing sensor returns the
    observations with its run requests (``dg.SensorResult(asset_events=...)``) and the CLI
    reports them before it submits a backfill (``instance.report_runless_asset_event``), so that
    the runs read the new version when they start. Both take a plain ``dg.AssetObservation``,
    which has no data version parameter; ``dg.ObserveResult`` and ``dg.DataVersionsByPartition``
    carry one, but only as the return value of an observation function. The latest versions
    are read back from the observations' tags (``assets.landing_files.latest_versions``).

    Upstream: no issue asks for a data version on ``dg.AssetObservation``; the webserver's REST
    endpoint ``/report_asset_observation/`` takes one (``data_version``), and
    dagster-io/dagster#33919 (tags on that endpoint) is about the same tag.
    """
    from dagster._core.definitions.data_version import DATA_VERSION_TAG

    return DATA_VERSION_TAG


def launch_backfill(instance: dg.DagsterInstance, defs: dg.Definitions, asset_keys: Iterable[dg.AssetKey],
                    partition_keys: Iterable[str], *, tags: dict[str, str], title: str) -> str:
    """Add an asset backfill of ``asset_keys`` for exactly ``partition_keys`` to the instance; its id.

    The backfill is Dagster's own: the backfill daemon cuts it into runs by the assets' backfill
    policy, the run queue launches them, and the UI lists it (Overview, Backfills) with its runs,
    each carrying ``tags`` and ``dagster/backfill=<id>``. Dagster 1.13 has no public route to
    create one from Python: the public route is the GraphQL mutation ``launchPartitionBackfill``,
    which needs a running webserver. What that mutation does is done here:
    ``PartitionBackfill.from_asset_partitions`` (``dagster._core.execution.backfill``, not
    exported) over the code location's asset graph (``Definitions.resolve_asset_graph``, not
    public), then ``DagsterInstance.add_backfill`` (not public). The id has the shape of
    Dagster's own (eight lowercase letters). Upstream: a Python API for launching asset
    backfills, dagster-io/dagster#26731.
    """
    import random
    import string
    import time

    from dagster._core.execution.backfill import PartitionBackfill

    backfill_id = "".join(random.choices(string.ascii_lowercase, k=8))
    backfill = PartitionBackfill.from_asset_partitions(
        backfill_id=backfill_id, asset_graph=defs.resolve_asset_graph(), partition_names=list(partition_keys),
        asset_selection=list(asset_keys), backfill_timestamp=time.time(), tags=dict(tags),
        dynamic_partitions_store=instance, all_partitions=False, title=title, description=None, run_config=None)
    instance.add_backfill(backfill)
    return backfill_id


def backfill_status(instance: dg.DagsterInstance, backfill_id: str) -> tuple[str, bool] | None:
    """``(status, finished)`` of the backfill ``backfill_id`` (None when the instance has none):
    Dagster's status name (``REQUESTED``, ``COMPLETED_SUCCESS``, ``COMPLETED_FAILED``,
    ``CANCELED``, ...) and whether the backfill daemon is done with it. ``instance.get_backfill``
    is not public; the public route is the GraphQL query ``partitionBackfillOrError``, which needs
    a running webserver (upstream: dagster-io/dagster#26731)."""
    backfill = instance.get_backfill(backfill_id)
    if backfill is None:
        return None
    return backfill.status.value, backfill.status.value not in ("REQUESTED", "CANCELING", "FAILING")
