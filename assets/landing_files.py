"""The landing files as an observable source asset, so the stale view reaches the input of ingest.

``landing_files`` is partitioned like the phases. The data version of a partition is a
fingerprint of the content digests of the files its ingest reads (its two files and the
reference files: :meth:`Landing.content_version`, over the digests the ingest input hash uses),
so it changes exactly when ingest's input changes; a touched but unchanged file keeps it. Every
table of ingest (the ``ingested_batch`` op's assets) depends on it. Dagster keeps, with each
materialization of those tables, the storage id of the latest observation of ``landing_files``; a
later observation of that partition with another data version shows that partition of ingest's
tables stale.

Who observes, always before the runs that read the files: the landing sensor (the partitions
whose files changed, in the tick that requests their runs: the daemon stores a tick's
observations before it submits its runs), the CLI before it submits a backfill
(:func:`observe`), the ``observe_landing`` job and schedule, and the UI's "Observe sources".
Dagster reads an input's latest observation when a step starts, and the materialization points
at it; so a run started after the observation of its files is fresh. Ingest does not observe:
an observation logged inside the step comes after that read, and would show the partition stale
at once. A run started before its files were observed (``dg launch`` or the UI right after a
file changed) shows stale once they are, though it read them: run it again (the phases skip
in the ledger) and it is fresh.

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
# The tag an observation's data version is stored under (Dagster's own; not exported).
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


#: Observations read per query by :func:`latest_versions`, at least.
PAGE = 200
#: Observations :func:`observe` reports at once.
REPORTERS = 8
#: Partitions asked for in one query: its page (twice as many records) stays under the 10,000
#: records Dagster returns at most per query.
CHUNK = 4_000


def latest_versions(instance: dg.DagsterInstance, keys: Iterable[str]) -> dict[str, str]:
    """Partition key -> data version of its latest observation of ``landing_files``.

    Dagster returns the observations of the asked partitions newest first, so the first one seen
    of a partition is its latest. The partitions are asked :data:`CHUNK` at a time, and each
    chunk's pages are read until every one of them has its version or none is left. A
    partition's observations are one per content change, so one page a chunk is the usual cost.
    Partitions never observed (or observed without a data version) are left out.
    """
    asked = sorted({str(k) for k in keys})
    found: dict[str, str] = {}
    for start in range(0, len(asked), CHUNK):
        part = asked[start:start + CHUNK]
        wanted = set(part)
        flt = dg.AssetRecordsFilter(asset_key=LANDING_KEY, asset_partitions=part)
        cursor, got = None, 0
        while True:
            page = instance.fetch_observations(flt, limit=max(PAGE, 2 * len(wanted)), cursor=cursor)
            for record in page.records:
                observation = record.asset_observation
                if observation is None or observation.partition not in wanted or observation.partition in found:
                    continue
                if DATA_VERSION_TAG in observation.tags:
                    found[observation.partition] = observation.tags[DATA_VERSION_TAG]
                    got += 1
            if got == len(wanted) or not page.has_more:
                break
            cursor = page.cursor
    return found


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
                    "the landing sensor and the CLI before the runs that read them, the observe_landing job/schedule and "
                    "'Observe sources'.",
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


def observe(instance: dg.DagsterInstance, zone: Landing, keys: Iterable[str]) -> dict[str, str]:
    """Observe the landing files of ``keys`` before runs that read them are submitted.

    Records an observation of ``landing_files`` (``instance.report_runless_asset_event``) for
    each of ``keys`` whose files' fingerprint differs from its latest observation, so that
    ingest, when its step starts, reads the version of the files it is about to read. For the
    CLI's submission path (the landing sensor does the same through its ``SensorResult``). A
    missing file counts in the fingerprint as missing, as in the sensor's observations of
    partitions that wait. Returns the versions recorded, by partition key.
    """
    from concurrent.futures import ThreadPoolExecutor

    changed = changed_versions(instance, zone, keys)
    # Each report is a few statements on connections of their own (dagster-postgres pools none),
    # mostly waiting on the server: a few at once.
    with ThreadPoolExecutor(max_workers=REPORTERS) as pool:
        for _ in pool.map(instance.report_runless_asset_event, observations(changed)):
            pass
    return changed
