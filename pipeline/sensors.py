"""Sensors: new landing files start a batch; the ledger's outbox keeps a batch going.

``landing_sensor``
    Looks at every ``<region>/<day>/`` folder of the landing zone. A partition's fingerprint is the
    sizes and modification times of its two files and of the reference files (a ``stat`` each, no
    reading: :meth:`Landing.stat_fingerprint`), so a tick over a year of folders is cheap. The
    cursor is a JSON map ``partition key -> fingerprint``; the partitions whose fingerprint changed
    (or are new) are requested in the key ranges a UI backfill's runs have
    (:func:`assets.plan.range_run_requests`), each with the run key
    ``landing:<key>:<fingerprint>`` (one partition) or ``landing:<first>..<last>:<digest of the
    fingerprints>`` (a range), so the same files never launch twice and changed files always
    launch again. Before requesting, the ledger is
    asked (:meth:`PhaseRunner.preflight`, content hashes): when every phase would skip (a file was
    touched but not changed), no run is launched. Folders of unknown regions, days before
    ``STORMLAKE_FIRST_DAY``, days after today and names that are not days are logged, one line each
    (:meth:`Landing.partition_keys`); today is a partition like any other. A partition still missing a file
    waits (it is not put in the cursor, so it is looked at again on the next tick). For the new or
    changed partitions and the waiting ones, the tick also observes the ``landing_files`` source
    asset: an ``AssetObservation`` with the fingerprint of the files' contents as data version
    (``assets/landing_files.py``), only where it differs from the partition's latest observation (a
    touched file keeps its version). Dagster stores these with the tick, before any run, so the UI
    shows the partition of ingest stale at once, whether or not a run follows.

``outbox_sensor``
    Reads the ledger's ``checkpoint_events`` in commit order (the cursor is a position (txid,
    event id), :meth:`Ledger.events_since`: only events of transactions older than every one still
    running, so an event committed late behind a higher id is read, never skipped), logs progress and
    failures, and continues partitions that stopped between phases: when a partition's latest
    event is a COMPLETED phase other than present (or a run's SKIPPED one: the phase was done
    already), the run that produced it is over (or unknown to this instance), whether it
    succeeded or failed, and the next phase is not already COMPLETED on that result, it requests
    the table assets of the remaining phases (and their graders) for the partition. Partitions
    that stopped after the same phase are requested together in the key ranges of a backfill's
    runs (at most ``STORMLAKE_PARTITIONS_PER_RUN`` neighbouring regions or consecutive days a run), with the run key
    ``outbox:<event id>`` (one partition) or ``outbox:<event id>,<event id>,…`` (a range, its
    partitions' events in key order); the run coordinator cuts such a range as it cuts a
    backfill's. While the producing run is still in progress the event is kept
    pending in the cursor and looked at again on the next tick. A range step that failed for some
    of its partitions fails its run's later steps for all of them; the ones it checkpointed are
    continued this way (:func:`assets.materialize.materialize_phase`). FAILED events are only
    reported: retrying is the run-retry policy's job. Each tick records in the ledger (``event_readers``,
    reader ``outbox_sensor``) how far it has read: the position of the cursor the tick started
    from, which Dagster has stored, less any event still pending in it. ``stormlake prune`` never deletes an event after that position, so
    a cursor that was not stored (a tick that died) is read again from events that still exist.

``landing_sensor`` is RUNNING by default: the day in progress is served as its files land
(docs/LIVE.md). ``STORMLAKE_LANDING_SENSOR=stopped`` registers it stopped, for an instance whose
runs an operator launches by hand; the UI's toggle (Automation) or ``dagster sensor start|stop
landing_sensor`` overrides the default either way. ``outbox_sensor`` is RUNNING by default too:
it only finishes work already started, so a partition whose run died between phases continues
without a person once the daemon runs. The code server that started the run (Dagster's default
run launcher) marks it failed as soon as its process is gone, and the sensor's next tick, at most
:data:`SENSOR_INTERVAL_S` later, requests the phases after the last completed one. With a
launcher whose runs are not children of the code server (``K8sRunLauncher``), run monitoring
finds the dead worker instead, within :data:`pipeline.instance.RUN_MONITORING_POLL_S`.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import asdict, dataclass

import dagster as dg

from assets.landing_files import changed_versions, observations
from assets.partitions import landing_keys, split_key
from assets.phases import PHASES, table_keys
from assets.plan import range_run_requests
from pipeline.jobs import storm_job
from resources.dagster_resources import LakeResource, LandingResource, PublisherResource
from resources.keys import LAUNCHED_BY, RANGE_END_TAG, RANGE_START_TAG
from resources.landing import Landing, NotAPartition, utc_today
from resources.ledger import Event, Ledger
from resources.ledger_resource import LedgerResource
from resources.ledger_views import LedgerViews
from resources.settings import load_settings

SENSOR_INTERVAL_S = 30
#: The landing sensor looks more often: during a storm a new version of today's files waits for
#: its tick before anything runs (a tick is a stat of each partition's files).
LANDING_INTERVAL_S = 10
OUTBOX_BATCH = 500
OUTBOX_READER = "outbox_sensor"  # its name in the ledger's event_readers
NEXT_PHASE = {a.name: b for a, b in zip(PHASES, PHASES[1:], strict=False)}


# ---- landing ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class LandingScan:
    fingerprints: dict[str, str]  # the new cursor: partition key -> fingerprint
    changed: list[str]  # keys whose fingerprint is new or changed, in (day, region) order
    waiting: list[str]  # keys of complete days still missing a file
    ignored: list[NotAPartition]  # folders that are not partitions, each with its reason


def scan_landing(landing: Landing, seen: dict[str, str], *, today: str) -> LandingScan:
    fingerprints: dict[str, str] = {}
    changed: list[str] = []
    waiting: list[str] = []
    keys, ignored = landing_keys(landing, today=today)
    for key in keys:
        day, region = split_key(key)
        fp = landing.stat_fingerprint(region, day)
        if fp is None:
            waiting.append(key)
            continue
        fingerprints[key] = fp
        if seen.get(key) != fp:
            changed.append(key)
    return LandingScan(fingerprints, changed, waiting, ignored)


def landing_run_key(group: list[str], fingerprints: dict[str, str]) -> str:
    """The run key of a run over ``group`` for its files as they are: ``landing:<key>:<fingerprint>``
    for one partition, ``landing:<first>..<last>:<digest of every key's fingerprint>`` for a range."""
    if len(group) == 1:
        return f"landing:{group[0]}:{fingerprints[group[0]]}"
    digest = hashlib.sha256("\n".join(f"{k}={fingerprints[k]}" for k in group).encode()).hexdigest()[:16]
    return f"landing:{group[0]}..{group[-1]}:{digest}"


def _load_map(cursor: str | None) -> dict[str, str]:
    if not cursor:
        return {}
    try:
        data = json.loads(cursor)
    except json.JSONDecodeError:
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


@dg.sensor(
    name="landing_sensor",
    job=storm_job,
    minimum_interval_seconds=LANDING_INTERVAL_S,
    default_status=(dg.DefaultSensorStatus.RUNNING if load_settings().landing_sensor == "running"
                    else dg.DefaultSensorStatus.STOPPED),
    description="Requests the (day, region) batches whose landing files are new or changed, today's included, in "
                "key ranges as a UI backfill's runs (run key landing:<key>:<fingerprint>, or "
                "landing:<first>..<last>:<digest> for a range), and observes landing_files for them. Running by "
                "default (STORMLAKE_LANDING_SENSOR=stopped registers it stopped).",
)
def landing_sensor(context: dg.SensorEvaluationContext, ledger: LedgerResource, lake: LakeResource,
                   landing: LandingResource, publisher: PublisherResource) -> dg.SensorResult:
    from assets.context import PartitionRef
    from assets.materialize import build_runner

    seen = _load_map(context.cursor)
    regions = landing.regions()
    zone = landing.get()
    scan = scan_landing(zone, seen, today=utc_today())
    runner = None
    to_run: list[str] = []
    unchanged: list[str] = []
    for key in scan.changed:
        if runner is None:
            runner = build_runner(None, ledger=ledger, lake=lake, landing=landing, publisher=publisher)
        if runner.preflight(PartitionRef.parse(key, regions)):
            unchanged.append(key)  # touched, not changed: every phase would skip
            continue
        to_run.append(key)
    requests = range_run_requests(to_run, run_key=lambda group: landing_run_key(group, scan.fingerprints),
                                  tags={LAUNCHED_BY: "landing_sensor"})
    # Observations of landing_files where the content changed (changed and waiting partitions).
    observed = changed_versions(context.instance, zone, [*scan.changed, *scan.waiting])
    if observed:
        context.log.info(f"observed new landing file contents of {len(observed)} partition(s): "
                         f"{', '.join(list(observed)[:10])}")
    if scan.waiting:
        context.log.info(f"waiting for files of {len(scan.waiting)} partition(s): {', '.join(scan.waiting[:10])}")
    if scan.ignored:
        for folder in scan.ignored[:10]:
            context.log.info(f"{folder}; not requested")
    if unchanged:
        context.log.info(f"{len(unchanged)} partition(s) touched but already done for this content: "
                         f"{', '.join(unchanged[:10])}")
    if requests:
        context.log.info(f"requesting {len(to_run)} partition(s) in {len(requests)} run(s): {', '.join(to_run[:10])}")
    cursor = json.dumps(scan.fingerprints, sort_keys=True, separators=(",", ":"))
    skip = None
    if not requests:
        skip = (f"no run needed: {len(unchanged)} new or changed partition(s) already done for their current content"
                if unchanged else f"no new or changed landing files ({len(scan.fingerprints)} partitions known)")
        if observed:
            skip += f"; observed landing_files of {len(observed)} partition(s)"
    return dg.SensorResult(run_requests=requests, cursor=cursor, skip_reason=skip,
                           asset_events=observations(observed))


# ---- outbox ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pending:
    """A COMPLETED event that may need a continuation, kept in the cursor until decided."""

    event_id: int
    partition_key: str
    phase: str
    run_id: str | None
    state_hash: str | None
    txid: int = 0

    @classmethod
    def of(cls, ev: Event) -> Pending:
        """A COMPLETED event carries its state hash; a SKIPPED one does not (its checkpoint's is the head's)."""
        return cls(ev.event_id, ev.partition_key, ev.phase, ev.run_id, (ev.detail or {}).get("state_hash"), ev.txid)


@dataclass
class OutboxCursor:
    """How far the outbox has read, as a position in commit order: (``after_txid``, ``after``), the
    writing transaction's id and the event id of the last event read (:meth:`Ledger.events_since`).
    A cursor stored before the ledger kept transaction ids has no ``after_txid``: 0, the txid of
    every event written before then, so it reads on from the same event."""

    after: int = 0  # event id of the last event read
    pending: dict[str, Pending] | None = None  # partition key -> its latest undecided COMPLETED event
    after_txid: int = 0  # transaction id of the last event read

    @classmethod
    def parse(cls, raw: str | None) -> OutboxCursor:
        if not raw:
            return cls(0, {})
        data = json.loads(raw)
        pending = {k: Pending(**v) for k, v in (data.get("pending") or {}).items()}
        return cls(int(data.get("after", 0)), pending, int(data.get("after_txid", 0)))

    @property
    def position(self) -> tuple[int, int]:
        return (self.after_txid, self.after)

    def read_up_to(self) -> tuple[int, int]:
        """Every event up to this position was read and decided; a pending one is still to be looked at."""
        return min([self.position, *((p.txid, p.event_id - 1) for p in (self.pending or {}).values())])

    def dump(self) -> str:
        return json.dumps({"after": self.after, "after_txid": self.after_txid,
                           "pending": {k: asdict(v) for k, v in sorted((self.pending or {}).items())}},
                          sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class OutboxDecision:
    cursor: OutboxCursor
    requests: list[dg.RunRequest]
    lines: list[str]  # progress report


def _run_in_progress(instance: dg.DagsterInstance, run_id: str | None) -> bool:
    if not run_id:
        return False
    run = instance.get_run_by_id(run_id)
    return run is not None and not run.is_finished


def outbox_run_key(group: list[Pending]) -> str:
    """``outbox:<event id>`` of a partition's continuation, ``outbox:<id>,<id>,…`` of a key range's
    (its partitions' events in key order): the same events never launch twice."""
    return "outbox:" + ",".join(str(p.event_id) for p in group)


def continuation_requests(ready: list[Pending]) -> list[dg.RunRequest]:
    """The runs of the phases after each event's phase, for its partition: the phases' tables and
    graders. Partitions that stopped after the same phase are continued together, in the key
    ranges of a backfill's runs (:func:`assets.plan.range_run_requests`): a year's
    backfill whose runs died is continued by one run per range, not one per partition; a range
    of one is a request of its partition."""
    from assets.materialize import grader_key

    requests: list[dg.RunRequest] = []
    names = [ph.name for ph in PHASES]
    for phase in sorted({p.phase for p in ready}, key=names.index):
        remaining = PHASES[names.index(phase) + 1:]
        of = {p.partition_key: p for p in ready if p.phase == phase}

        def tags(group: list[str], phase: str = phase, of: dict[str, Pending] = of) -> dict[str, str]:
            return {LAUNCHED_BY: "outbox_sensor", "stormlake/outbox_event": ",".join(str(of[k].event_id) for k in group),
                    "stormlake/resume_after": phase}

        requests += range_run_requests(
            sorted(of), run_key=lambda group, of=of: outbox_run_key([of[k] for k in group]), tags=tags,
            asset_selection=table_keys(remaining),
            asset_check_keys=[dg.AssetCheckKey(grader_key(ph), "grader") for ph in remaining])
    return requests


def evaluate_outbox(ledger: Ledger, instance: dg.DagsterInstance, cursor: OutboxCursor, *,
                    batch: int = OUTBOX_BATCH) -> OutboxDecision:
    """One tick of the outbox: read new events, decide which partitions to continue.

    ``cursor`` is the stored one (the previous tick's result): its position is recorded in the
    ledger first, so that pruning keeps every event this tick and the next ones may read.
    """
    ledger.record_reader(OUTBOX_READER, cursor.read_up_to())
    events = ledger.events_since(cursor.position, limit=batch)
    lines: list[str] = []
    candidates: dict[str, Pending] = dict(cursor.pending or {})
    if events:
        counts = Counter(ev.status for ev in events)
        lines.append(f"events {events[0].event_id}..{events[-1].event_id}: "
                     + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    published: list[str] = []
    held: list[str] = []
    for ev in events:
        if ev.status == "FAILED":
            lines.append(f"FAILED {ev.phase} of {ev.partition_key} (attempt {ev.attempt}, run {ev.run_id}): "
                         f"{(ev.detail or {}).get('error_class', 'error')}; the run retry policy decides on a retry")
        elif ev.status == "SKIPPED" and ev.run_id and ev.phase in NEXT_PHASE:
            # A run found the phase done: its own later steps may not have run (a range step that
            # failed for other partitions skips them). A skip a preflight recorded has no run.
            candidates[ev.partition_key] = Pending.of(ev)
        elif ev.status == "COMPLETED":
            if ev.phase in NEXT_PHASE:
                candidates[ev.partition_key] = Pending.of(ev)
            elif ev.tier is not None and ev.tier < PHASES[-1].tier:
                held.append(ev.partition_key)  # graded noisy: written, not delivered (stormlake review)
            else:
                published.append(ev.partition_key)
    if published:
        lines.append(f"published: {', '.join(published[:20])}" + (" …" if len(published) > 20 else ""))
    if held:
        lines.append(f"held for review (noisy; stormlake review): {', '.join(held[:20])}"
                     + (" …" if len(held) > 20 else ""))
    after_txid, after = events[-1].position if events else cursor.position
    if not candidates:
        return OutboxDecision(OutboxCursor(after, {}, after_txid), [], lines)

    keys = sorted(candidates)
    latest = LedgerViews(ledger).last_event_ids(keys)
    heads = {(cp.partition_key, cp.phase): cp for cp in ledger.heads(keys)}
    pending: dict[str, Pending] = {}
    ready: list[Pending] = []
    for key in keys:
        p = candidates[key]
        if latest.get(key) != p.event_id:
            continue  # the partition moved on (the next phase started, or a skip/failure came after)
        nxt = NEXT_PHASE[p.phase]
        head = heads.get((key, nxt.name))
        own = heads.get((key, p.phase))
        state_hash = p.state_hash or (own.state_hash if own is not None else None)
        if (head is not None and head.status == "COMPLETED"
                and (head.summary or {}).get("upstream", {}).get(p.phase) == state_hash):
            continue  # the next phase is already done on this result
        if _run_in_progress(instance, p.run_id):
            pending[key] = p  # its own run may still go on to the next phase: look again next tick
            continue
        ready.append(p)
        lines.append(f"continuing {key} after {p.phase} (event {p.event_id}, run {p.run_id or '-'} is over)")
    requests = continuation_requests(ready)
    for r in requests:
        keys_of = (f"{r.tags[RANGE_START_TAG]}..{r.tags[RANGE_END_TAG]}" if RANGE_START_TAG in r.tags
                   else str(r.partition_key))
        lines.append(f"run {r.run_key} for {keys_of}: {', '.join(k.to_user_string() for k in r.asset_selection or [])}")
    return OutboxDecision(OutboxCursor(after, pending, after_txid), requests, lines)


@dg.sensor(
    name="outbox_sensor",
    job=storm_job,
    minimum_interval_seconds=SENSOR_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Reads the ledger's checkpoint events in commit order, reports progress and failures, and continues a "
                "partition that stopped between phases, neighbours together in key ranges (run key outbox:<event ids>). "
                "Running by default: it only finishes work already started.",
)
def outbox_sensor(context: dg.SensorEvaluationContext, ledger: LedgerResource) -> dg.SensorResult:
    decision = evaluate_outbox(ledger.get(), context.instance, OutboxCursor.parse(context.cursor))
    for line in decision.lines:
        (context.log.warning if line.startswith("FAILED") else context.log.info)(line)
    pending = decision.cursor.pending or {}
    skip = None
    if not decision.requests:
        skip = f"nothing to continue (read up to event {decision.cursor.after}; {len(pending)} waiting on a run)"
    return dg.SensorResult(run_requests=decision.requests, cursor=decision.cursor.dump(), skip_reason=skip)


SENSORS = [landing_sensor, outbox_sensor]
