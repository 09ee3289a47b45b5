"""The landing files as an observable source asset, so the stale view reaches the input of ingest.

``landing_files`` is partitioned like the phases. The data version of a partition is a
fingerprint of the content digests of the files its ingest reads (its two files and the
reference files: :meth:`Landing.content_version`, over the digests the ingest input hash uses),
so it changes exactly when ingest's input changes; a touched but unchanged file keeps it. Every
table of ingest (the ``ingested_batch`` op's assets) depends on it. Dagster keeps, with each
materialization of those tables, the storage id of the latest observation of ``landing_files``; a
later observation of that partition with another data version shows that partition of ingest's
tables stale.

Who observes: the landing sensor (partitions whose files changed), the ``observe_landing`` job and
schedule, the UI's "Observe sources", and the ingest step itself. The ingest step makes sure the
partition's latest observation carries the fingerprint of the files it is about to read, and
then has Dagster read the latest observation again, so that a freshly materialized ingest is
not stale (see :func:`observe_for_ingest`).

Observations are only recorded for partitions whose fingerprint differs from their latest
observation: an equal one changes nothing in the stale view and would only add events.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping

import dagster as dg

from assets.partitions import PARTITIONS, landing_keys, split_key
from resources import dagster_compat
from resources.dagster_resources import LandingResource
from resources.landing import Landing

LANDING_FILES = "landing_files"
LANDING_KEY = dg.AssetKey(LANDING_FILES)
LANDING_GROUP = "landing"
# The tag an observation's data version is stored under (Dagster's own; not exported). Dagster
# indexes it, so the latest version of many partitions is one query.
DATA_VERSION_TAG = dagster_compat.data_version_tag()


def landing_version(landing: Landing, region_id: str, day: str) -> str:
    """The data version of a partition's landing files (:meth:`Landing.content_version`)."""
    return landing.content_version(region_id, day)


def keys_with_files(landing: Landing, *, today: str | None = None) -> list[str]:
    """Partition keys whose folder holds at least one of the partition's files, in (day, region) order."""
    with_files = []
    for key in landing_keys(landing, today=today)[0]:
        day, region = split_key(key)
        if landing.has_partition_files(region, day):
            with_files.append(key)
    return with_files


def latest_versions(instance: dg.DagsterInstance, keys: Iterable[str]) -> dict[str, str]:
    """Partition key -> data version of its latest observation of ``landing_files`` (one query)."""
    return dagster_compat.latest_observation_versions(instance, LANDING_KEY, keys)


def changed_versions(instance: dg.DagsterInstance, landing: Landing, keys: Iterable[str]) -> dict[str, str]:
    """Fingerprints of the ``keys`` whose latest observation is missing or carries another version."""
    current = {}
    for key in keys:
        day, region = split_key(key)
        current[str(key)] = landing_version(landing, region, day)
    latest = latest_versions(instance, current)
    return {k: v for k, v in current.items() if latest.get(k) != v}


def observations(versions: Mapping[str, str]) -> list[dg.AssetObservation]:
    """Observations of ``landing_files`` carrying the given data versions (as the observe function's are)."""
    return [dg.AssetObservation(asset_key=LANDING_KEY, partition=key, tags={DATA_VERSION_TAG: version})
            for key, version in versions.items()]


# ``observable_source_asset`` and ``DataVersionsByPartition`` are beta; landing_files uses them
# deliberately (a partitioned source asset whose data version Dagster compares).
with warnings.catch_warnings():
    warnings.simplefilter("ignore", dg.BetaWarning)

    @dg.observable_source_asset(
        name=LANDING_FILES,
        partitions_def=PARTITIONS,
        group_name=LANDING_GROUP,
        description="The landing files each (day, region) batch's ingest reads (its outages.csv and weather.csv "
                    "and the reference files). Data version: a fingerprint of their content digests. Observed by "
                    "the landing sensor, the observe_landing job/schedule, 'Observe sources' and the ingest step.",
    )
    def landing_files(context: dg.OpExecutionContext, landing: LandingResource) -> dg.DataVersionsByPartition:
        """Every partition with landing files whose fingerprint changed since its latest observation."""
        zone = landing.get()
        keys = keys_with_files(zone)
        changed = changed_versions(context.instance, zone, keys)
        context.log.info(f"{len(keys)} partition(s) with landing files; {len(changed)} new or changed"
                         + (f": {', '.join(list(changed)[:10])}" if changed else ""))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dg.BetaWarning)
            return dg.DataVersionsByPartition(changed)


def observe_for_ingest(context: dg.AssetExecutionContext, landing: LandingResource) -> dict[str, str]:
    """Before ingest reads its files: record their fingerprint where the latest observation differs.

    Dagster reads the latest observation of ``landing_files`` (its storage id is what later
    observations are compared against) once, when the step starts, before this body runs. An
    observation logged here is stored at once but would not be seen by that read: the
    materialization would point before it, and the observation would then count as a change. So
    the step reads it again right after (:func:`resources.dagster_compat.refresh_input_version`:
    Dagster has no public way to), when it logged any.
    Handles every partition of the step (a range run has several).
    Returns the versions logged, by partition key.
    """
    zone = landing.get()
    changed = changed_versions(context.instance, zone, context.partition_keys)
    if changed:  # what Dagster read when the step started is still the latest otherwise
        for observation in observations(changed):
            context.log_event(observation)
        dagster_compat.refresh_input_version(context, LANDING_KEY)
    return changed
