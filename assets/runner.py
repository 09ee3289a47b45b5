"""The one phase runner all four assets use: the phase protocol of docs/DESIGN.md.

1. input hash  2. decide (skip?)  3. lease + claim  4. compute on pinned inputs
5. grade  6. idempotent Delta writes  7. deliveries with receipts  8. checkpoint commit
On any error: FAILED with the error, in its own transaction, then re-raise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any

from assets.checks import Check, schema_checks
from assets.context import (
    Compute,
    Grader,
    MadeCalls,
    PartitionRef,
    PhaseContext,
    PhaseOutput,
    UpstreamNotReady,
    UpstreamOutdated,
    call_key,
    partition_file_names,
    pinned_files,
)
from assets.delivery import deliver
from assets.hashing import hash_json, table_hash
from assets.phases import BY_NAME, LAST_READER, PHASES, TABLE_PHASE, Phase
from assets.quality import HELD_LABEL
from assets.summaries import check_figures, check_summary, read_summary
from resources import faults
from resources.errors import ConfigError, GraderError, LedgerUnavailable, StormlakeError, SummaryInvalid
from resources.keys import BY_TAG, FORCE_ID_TAG, FROM_TAG, REASON_TAG
from resources.lake import Lake, PartitionWrite, ProcessThreads, WriteResult, at_once, in_background
from resources.landing import Landing
from resources.ledger import Checkpoint, Claim, Decision, Ledger
from resources.memory import keep_freed_memory
from resources.publisher import Artifact, Target
from resources.settings import DEFAULT_DEAD_LETTER_AFTER, DEFAULT_WRITE_TOGETHER, Region

Log = Callable[[str], None]


def prepare_process() -> None:
    """Ready this process for phases, once, before its first phase allocates.

    - The allocator keeps freed memory for the next partition (:mod:`resources.memory`).
    - What the process holds already (Dagster, its definitions, the imported libraries) moves
      out of the garbage collector's sight (``gc.freeze``): those objects live as long as the
      process, and without this every full collection triggered by a phase's allocations walks
      all of them again. Objects made afterwards are collected as usual.

    A process that was prepared once is left as it is, so the partitions' own objects are never
    frozen. A flag says so, not ``gc.get_freeze_count()``, which walks every frozen object.
    """
    global _prepared
    if not _prepared:
        _prepared = True
        keep_freed_memory()
        gc.freeze()


_prepared = False

#: The thread a range step's held partitions are finished in (written, recorded, delivered,
#: committed) while the step computes its next partition: one a process, one flush at a time.
_flusher = ProcessThreads(1, "stormlake-flush")


_log = logging.getLogger("stormlake.runner")


@dataclass(frozen=True)
class Outcome:
    phase: str
    partition_key: str
    status: str  # SKIPPED | COMPLETED
    checkpoint: Checkpoint
    delivered: tuple[str, ...] = ()
    checks: tuple[Check, ...] = ()

    @property
    def state_hash(self) -> str:
        return self.checkpoint.state_hash or ""

    @property
    def table_hashes(self) -> dict[str, str]:
        """Content hash (:func:`table_hash`) of each table the checkpoint wrote; empty for a
        checkpoint committed before they were recorded."""
        return dict((self.checkpoint.summary or {}).get("table_hashes") or {})


def _recorded_files(cp: Checkpoint | None) -> dict[str, tuple[str, str]]:
    """(stamp, digest) per landing file as an ingest checkpoint recorded them (none if it did not)."""
    summary = (cp.summary or {}) if cp is not None else {}
    files, stamps = summary.get("input_files") or {}, summary.get("input_stamps") or {}
    return {rel: (stamps[rel], digest) for rel, digest in files.items() if rel in stamps}


class DeadLettered(StormlakeError):
    """The phase failed too often on the same inputs; it waits for ``stormlake release``."""


def dead_letter_line(head: Checkpoint) -> str:
    """The one line that says a (partition, phase) is dead-lettered: its last error, what to run."""
    last = (head.error_message or "").splitlines()[0] if head.error_message else ""
    return (f"{head.phase} of {head.partition_key} is dead-lettered after {head.failures} failures on these inputs"
            f" (last: {head.error_class}: {last}); fix the cause, then `stormlake release {head.partition_key}"
            " --reason TEXT`")


@dataclass(frozen=True)
class Force:
    """A re-run forced from ``from_phase`` on: that phase and every later one compute again.

    Asked for by ``stormlake backfill --from PHASE --reason TEXT`` or by the run tags
    :data:`FROM_TAG`, :data:`REASON_TAG` and :data:`BY_TAG` on a run launched anywhere else.
    """

    from_phase: str
    reason: str
    by: str
    id: str  # one per request: the runs of one forced backfill (and their retries) share it

    def covers(self, phase: Phase) -> bool:
        return phase.tier >= BY_NAME[self.from_phase].tier

    @classmethod
    def from_tags(cls, tags: Mapping[str, str], run_id: str | None = None) -> Force | None:
        name = tags.get(FROM_TAG)
        if not name:
            return None
        if name not in BY_NAME:
            raise ConfigError(f"run tag {FROM_TAG}={name!r} names no phase (one of {', '.join(BY_NAME)})")
        reason = (tags.get(REASON_TAG) or "").strip()
        if not reason:
            raise ConfigError(f"run tag {FROM_TAG}={name} needs a reason: the run tag {REASON_TAG}")
        return cls(name, reason, tags.get(BY_TAG) or "unknown", tags.get(FORCE_ID_TAG) or run_id or "")

    def tags(self) -> dict[str, str]:
        return {FROM_TAG: self.from_phase, REASON_TAG: self.reason, BY_TAG: self.by, FORCE_ID_TAG: self.id}


#: A range step writes the tables of at most ``STORMLAKE_WRITE_TOGETHER`` partitions at once
#: (:attr:`PhaseRunner.write_together`; their leases held meanwhile, on one ledger session a group)
#: and of at most about this many rows in all: a big partition is written alone, as soon as it
#: is computed (its commit is a small part of its cost, and its rows are not kept waiting).
RANGE_WRITE_ROWS = 50_000


@dataclass
class _Prepared:
    """A partition's attempt computed and graded, its lease held, its tables not yet written."""

    ctx: PhaseContext
    claim: Claim
    basis: dict[str, Any]
    out: PhaseOutput
    checks: list[Check]
    hashing: dict[str, Future[str]]  # each table's content hash, computing since the tables were made
    lease: contextlib.ExitStack

    @functools.cached_property
    def hashes(self) -> dict[str, str]:
        """Each table's content hash (:func:`table_hash`), waited for (first needed by the writes)."""
        return {table: digest.result() for table, digest in self.hashing.items()}

    @property
    def phase(self) -> Phase:
        return self.ctx.phase

    @property
    def part(self) -> PartitionRef:
        return self.ctx.partition

    @property
    def rows(self) -> int:
        return sum(t.num_rows for t in self.out.tables.values())

    def call_key(self, table: str) -> str:
        """The key of the recorded call of this partition's write of ``table``."""
        return call_key("delta_commit", table, _write_input(self.ctx.partition, self.hashes[table]))


@dataclass(frozen=True)
class _Finished:
    """A partition's attempt written, recorded and delivered: the checkpoint it commits."""

    state_hash: str
    summary: dict[str, Any]
    tier: int
    tier_label: str
    delivered: tuple[str, ...]


def _let_go(p: _Prepared, exc: BaseException | None, *, log: Log | None = None) -> None:
    """Release a held partition's lease (:func:`_let_go_lease`)."""
    _let_go_lease(p.lease, exc, log=log, what=f"{p.phase.name} {p.part.key}")


def _let_go_lease(lease: contextlib.ExitStack, exc: BaseException | None, *, log: Log | None = None,
                  what: str = "") -> None:
    """Release a lease. A lease whose unlock fails (its connection lost) is released by the
    server with the session, so that is only logged."""
    try:
        if exc is None:
            lease.close()
        else:
            lease.__exit__(type(exc), exc, exc.__traceback__)
    except Exception as inner:  # noqa: BLE001 - the lock dies with its session
        if log is not None:
            log(f"{what}: releasing the lease failed ({inner})")


@dataclass(frozen=True)
class _Ready:
    """A partition with work for the phase, before its lease and claim (steps 1-3 done)."""

    phase: Phase
    part: PartitionRef
    ups: dict[str, Checkpoint]
    basis: dict[str, Any]
    args: dict[str, Any]  # what the ledger's claim takes


@dataclass
class _Claimed:
    """A partition's attempt claimed, its lease held, not yet computed."""

    ready: _Ready
    claim: Claim
    lease: contextlib.ExitStack

    @property
    def phase(self) -> Phase:
        return self.ready.phase

    @property
    def part(self) -> PartitionRef:
        return self.ready.part


def _write_input(part: PartitionRef, content_hash: str) -> dict[str, str]:
    """A table write's recorded input: the partition and the content written."""
    return {"partition": part.key, "content": content_hash}


class PhaseRunner:
    """Runs phases for partitions against one ledger, lake, landing zone and target set."""

    def __init__(self, *, ledger: Ledger, lake: Lake, landing: Landing, targets: list[Target],
                 regions: dict[str, Region], run_id: str | None = None, log: Log | None = None,
                 outcome_log: Log | None = None, lease_timeout_s: float = 900.0, force: Force | None = None,
                 dead_letter_after: int = DEFAULT_DEAD_LETTER_AFTER, write_together: int = DEFAULT_WRITE_TOGETHER):
        self.ledger = ledger
        self.write_together = write_together
        self.dead_letter_after = dead_letter_after
        self.force = force
        self.lake = lake
        self.landing = landing
        self.targets = targets
        self.regions = regions
        self.run_id = run_id
        self.log: Log = log or (lambda _msg: None)
        # A partition's outcome line (COMPLETED, SKIPPED); by default with the other lines.
        self.outcome_log: Log = outcome_log or self.log
        self.lease_timeout_s = lease_timeout_s
        self._behind: Future[bool] | None = None  # the flush in flight (:meth:`_flush_behind`)
        prepare_process()

    # ---- 1. input hash -----------------------------------------------------------------
    def upstream(self, phase: Phase, part: PartitionRef,
                 heads: list[Checkpoint] | None = None) -> tuple[dict[str, Checkpoint], Checkpoint | None]:
        """The COMPLETED head checkpoints of the phases ``phase`` reads, and ``phase``'s own head
        (from ``heads``, the partition's head checkpoints, when given, else read now).

        Each must come from the current schema and code version of its phase: a selection that
        leaves an upgraded phase out (``--select operational_picture`` after a schema bump of
        correlate) would otherwise compute on tables of the old shape.
        """
        heads = {cp.phase: cp for cp in (self.ledger.heads([part.key]) if heads is None else heads)}
        ups: dict[str, Checkpoint] = {}
        for name in phase.upstream_phases:
            cp = heads.get(name)
            if cp is None or cp.status != "COMPLETED":
                state = "never run" if cp is None else cp.status
                raise UpstreamNotReady(
                    f"{phase.name} of {part.key} needs {name} COMPLETED first ({name} is {state}); "
                    "materialize the upstream assets too"
                )
            current = BY_NAME[name]
            if (cp.schema_version, cp.code_version) != (current.schema_version, current.code_version):
                raise UpstreamOutdated(
                    f"{phase.name} of {part.key} needs {name} at schema version {current.schema_version},"
                    f" code version {current.code_version}, but its checkpoint has schema version"
                    f" {cp.schema_version}, code version {cp.code_version}; run {name} first"
                    f" (materialize its tables {', '.join(current.tables)} with this partition)"
                )
            read_summary(cp)  # what this phase reads of it must be there: SummaryInvalid names the field
            ups[name] = cp
        return ups, self._own_head(phase, heads.get(phase.name))

    def _own_head(self, phase: Phase, head: Checkpoint | None) -> Checkpoint | None:
        """The phase's own head, its summary checked (:func:`read_summary`), as the input hash reads it.

        A head whose stored summary does not read stops the phase (:class:`SummaryInvalid`), except
        where the phase computes again whatever the summary says: in a forced re-run of it (the
        re-run that replaces it), or when the head is of another schema or code version of the
        phase. The head is then read without its summary (every landing file is read again).
        """
        if head is None:
            return None
        try:
            read_summary(head)
        except SummaryInvalid:
            forced = self.force is not None and self.force.covers(phase)
            if not forced and (head.schema_version, head.code_version) == (phase.schema_version, phase.code_version):
                raise
            return dataclasses.replace(head, summary={})
        return head

    def input_hash(self, phase: Phase, part: PartitionRef, ups: dict[str, Checkpoint],
                   prior: Checkpoint | None = None) -> tuple[str, dict[str, Any]]:
        """The phase's input hash for the partition, and the basis it was computed from.

        ``prior``: the phase's head checkpoint, if any. For ingest, the landing files whose
        stamp it recorded are unchanged are not read again (their recorded digests are used);
        the stamps go into ``basis["stamps"]``, outside the hash.
        """
        stamps: dict[str, str] = {}
        basis: dict[str, Any] = {
            "phase": phase.name,
            "code_version": phase.code_version,
            "schema_version": phase.schema_version,
            "partition": part.key,
        }
        if phase.name == "ingest":
            basis["region"] = part.region.fingerprint()
            stamped = self.landing.stamped_digests(part.region.region_id, part.day, known=_recorded_files(prior))
            basis["files"] = {rel: digest for rel, (_, digest) in stamped.items()}
            stamps = {rel: stamp for rel, (stamp, _) in stamped.items()}
            basis["known_regions"] = sorted(self.regions)
        basis["upstream"] = {name: cp.state_hash for name, cp in sorted(ups.items())}
        # A new schema or code version upstream recomputes this phase even when the upstream
        # output happens to be identical: "that phase and every phase after it recompute".
        basis["upstream_versions"] = {name: [cp.schema_version, cp.code_version] for name, cp in sorted(ups.items())}
        if phase.name == "present":
            basis["targets"] = sorted(f"{t.name}:{t.ref(Artifact(part.region.region_id, part.day, 'summary.json', b''))}"
                                      for t in self.targets)
        ih = hash_json(basis)
        release = self._release_of(phase, part, prior, ih)
        if release is not None:
            # An operator released the held head: present computes again on the same inputs and
            # this time delivers; the natural hash is kept so later runs find the result current.
            basis["natural_input_hash"] = ih
            basis["released"] = release
            ih = hash_json({**basis, "released": release["action_id"]})
        elif self.force is not None and self.force.covers(phase):
            # A forced re-run: a hash of its own (the run's), so the head is superseded and the
            # phase computed again; the natural hash is kept to recognise the result later.
            basis["natural_input_hash"] = ih
            ih = hash_json({**basis, "forced": self.force.id})
        elif prior is not None and prior.status == "COMPLETED" and (prior.summary or {}).get("natural_input_hash") == ih:
            ih = prior.input_hash  # the head is a forced re-run on these very inputs: it is current
        if stamps:
            basis["stamps"] = stamps  # recorded by ingest, not hashed
        return ih, basis

    def _release_of(self, phase: Phase, part: PartitionRef, prior: Checkpoint | None, ih: str) -> dict[str, Any] | None:
        """The operator's release that this run of ``phase`` carries out, if any.

        A release names the held head's natural input hash (a head held by a forced re-run has a
        hash of its own). It applies while the head is that held checkpoint, or an attempt of the
        released run that failed or was cut short, and until a COMPLETED checkpoint has carried it
        out (:meth:`Ledger.release_of`); the head of every other run is left to the usual skip.
        """
        if prior is None:
            return None
        summary = prior.summary or {}
        if prior.status == "COMPLETED" and (
                not summary.get("held") or summary.get("natural_input_hash", prior.input_hash) != ih):
            return None
        return self.ledger.release_of(part.key, phase.name, ih)

    def _would_skip(self, phase: Phase, part: PartitionRef, heads: dict[str, Checkpoint]) -> bool:
        """Whether ``phase`` would skip given the partition's head checkpoints (as :meth:`run` decides)."""
        cp = heads.get(phase.name)
        if cp is None or cp.status != "COMPLETED" or cp.schema_version != phase.schema_version:
            return False
        if any(name not in heads for name in phase.upstream_phases):
            return False
        try:  # a summary that does not read is the run's to report, for its partition alone
            for c in (cp, *(heads[name] for name in phase.upstream_phases)):
                read_summary(c)
        except SummaryInvalid:
            return False
        return self.input_hash(phase, part, {name: heads[name] for name in phase.upstream_phases}, prior=cp)[0] == cp.input_hash

    def prefetch(self, phase: Phase, part: PartitionRef, ups: dict[str, Checkpoint] | None = None) -> None:
        """Start reading the partition's inputs for ``phase`` in the background, if it has work.

        Called by a range step for the next partition while it computes the current one, and
        by the CLI for the first partition of a run it is about to launch. Only
        when every upstream phase is COMPLETED and this phase would not skip; any doubt (the
        ledger unreachable) just means no prefetch: the phase reads as usual. ``ups``: the
        upstream checkpoints of an attempt claimed already (it has work; nothing is read from
        the ledger).
        """
        if not phase.input_tables:
            return
        if ups is not None:
            heads = ups
        else:
            try:
                heads = {cp.phase: cp for cp in self.ledger.heads([part.key])}
                if (any(name not in heads or heads[name].status != "COMPLETED" for name in phase.upstream_phases)
                        or self._would_skip(phase, part, heads)):
                    return
            except StormlakeError:
                return
        for table in phase.input_tables:
            summary = heads[TABLE_PHASE[table]].summary
            self.lake.prefetch(table, part.region.region_id, part.day, version=summary["delta_versions"][table],
                               files=pinned_files(summary, table, part))

    # ---- the protocol ------------------------------------------------------------------
    def current_heads(self, part: PartitionRef) -> list[Checkpoint]:
        """The head checkpoints of the phases, from the first, that would skip as the partition stands.

        Uses the same input hashes as :meth:`run`, so it never disagrees with what a run would
        decide. A caller (the CLI, the sensors) launches no run when every phase would skip,
        and leaves the leading ones out of the run it launches (a resumed partition runs from
        the phase that did not finish, not through steps that can only skip).
        """
        heads = {cp.phase: cp for cp in self.ledger.heads([part.key])}
        current: list[Checkpoint] = []
        for phase in PHASES:
            if not self._would_skip(phase, part, heads):
                break
            current.append(heads[phase.name])
        return current

    def record_skips(self, heads: Iterable[Checkpoint]) -> None:
        """Record a skip for each of these head checkpoints (found current by a preflight)."""
        for cp in heads:
            self.ledger.record_skip(cp, self.run_id)

    def preflight(self, part: PartitionRef) -> bool:
        """Whether every phase of the partition would skip; if so, record the skips."""
        current = self.current_heads(part)
        if len(current) < len(PHASES):
            return False
        self.record_skips(current)
        return True

    def run(self, phase: Phase, part: PartitionRef, compute: Compute, grader: Grader | None = None) -> Outcome:
        """Run ``phase`` for one partition; its error is raised."""
        result = self.run_range(phase, [part], compute, grader)[0][1]
        if isinstance(result, BaseException):
            raise result
        return result

    def run_range(self, phase: Phase, parts: list[PartitionRef], compute: Compute,
                  grader: Grader | None = None) -> list[tuple[str, Outcome | StormlakeError]]:
        """Run ``phase`` for the partitions of a range step, in order; each one's key and outcome or
        error, in their order (not every partition's when a transient error ended the range).

        Each partition goes through the protocol on its own (its lease, its claim, its
        checkpoint, its failure), with two differences for small partitions: they are claimed
        together, and their tables are written together. The first partition is claimed alone;
        once its size is known, the next ones are claimed as many at a time as would be written
        together (their heads read in one query, each lease taken if free, their attempts
        claimed in one transaction, :meth:`Ledger.claim_all`), then computed one by one. Up to
        :attr:`write_together` partitions (``STORMLAKE_WRITE_TOGETHER``, 8) of at most
        :data:`RANGE_WRITE_ROWS` rows in all are computed and graded, their leases held; then
        each table is written once for all of them (:meth:`Lake.overwrite_partitions`, one app
        transaction per partition), their writes are recorded in one statement, each partition
        delivers, and their checkpoints commit in one statement (each fenced on its own). A Delta commit costs
        about the same for one small partition as for eight, and more as a table grows
        (docs/DESIGN.md, "Limits at a year's scale"). A partition that fails is alone in
        failing; a write together that fails leaves each partition to write alone. A lease that
        another run holds is never waited for while this one holds others: such a partition is
        left out of its group and taken on its own once the partitions held are finished. When
        another partition is to be computed, the partitions held are finished in the flusher
        thread meanwhile (:meth:`_flush_behind`); the last ones on this thread.

        The first transient error (the ledger unreachable) ends the range after the partitions
        already computed are finished: the step fails for Dagster's retry. Any other exception
        (a bug) is raised once the partitions held are finished; an interrupt lets them go,
        recorded FAILED. Partitions claimed but not yet computed when the range ends are let go,
        recorded FAILED (``RangeAbandoned``, not counted toward a dead letter); the next run
        takes them over. No lease stays held on any path.
        """
        results: dict[str, Outcome | StormlakeError] = {}
        pending: list[_Prepared] = []
        claimed: list[_Claimed] = []
        window = 1  # how many partitions are claimed together: as many as are written together
        stop = False
        try:
            i = 0
            while i < len(parts) and not stop:
                # No more leases held at once than partitions written together.
                group = parts[i:i + max(1, min(window, self.write_together - len(pending)))]
                i += len(group)
                ready, stop = self._decide_all(phase, group, results)
                busy: list[PartitionRef] = []
                if ready and not stop:
                    claimed, busy, stop = self._claim_all(phase, ready, results)
                while claimed and not stop:
                    c = claimed.pop(0)
                    # Read the next partition while this one computes.
                    if claimed:
                        self.prefetch(phase, claimed[0].part, ups=claimed[0].ready.ups)
                    elif following := busy[:1] or parts[i:i + 1]:
                        self.prefetch(phase, following[0])
                    try:
                        prepared = self._attempt(c, compute, grader)
                    except StormlakeError as exc:
                        self._note(phase, c.part, exc, results)
                        stop = exc.transient
                        continue
                    except BaseException:
                        self.ledger.tell_watchers(phase.name, c.part.key, "FAILED")
                        raise
                    window = max(1, min(self.write_together, RANGE_WRITE_ROWS // max(1, prepared.rows)))
                    more = bool(claimed or busy) or i < len(parts)
                    stop = self._hold(prepared, pending, results, more=more)
                for j, part in enumerate(busy):  # their leases are held by another run: one by one
                    if stop:
                        break
                    following = busy[j + 1:j + 2] or parts[i:i + 1]
                    if following:
                        self.prefetch(phase, following[0])
                    stop = self._one(phase, part, compute, grader, pending, results, more=bool(following))
            self._flush_now(pending, results)
        except Exception:
            self._abandon(claimed, computed=False)
            try:
                self._settle_behind()
            except BaseException:  # an interrupt while waiting: the ones held are let go
                self._abandon(pending)
                raise
            self._flush(pending, results)  # a bug raised for one partition: the ones held are finished first
            raise
        except BaseException:
            self._abandon(claimed, computed=False)
            try:
                self._settle_behind()  # an interrupt: the flush in flight ends as it would have
            finally:
                self._abandon(pending)  # the ones held are let go, recorded FAILED (a second interrupt too)
            raise
        self._abandon(claimed, computed=False)  # a transient error ended the range before them
        return [(part.key, results[part.key]) for part in parts if part.key in results]

    def _hold(self, prepared: _Prepared, pending: list[_Prepared], results: dict[str, Outcome | StormlakeError],
              *, more: bool = False) -> bool:
        """Hold a computed partition for the write together, flushing as the limits say; whether
        a flush ended the range (a transient error). ``more``: whether the step computes another
        partition after this one; a flush is then made behind (:meth:`_flush_behind`)."""
        flush = self._flush_behind if more else self._flush_now
        ended = False
        if prepared.rows >= RANGE_WRITE_ROWS:  # a big partition is written alone: the small ones held go first
            try:
                ended = flush(pending, results)
            except BaseException:
                pending.append(prepared)  # the step's error path finishes it (or lets it go) with the others
                raise
        pending.append(prepared)
        return ended or ((len(pending) >= self.write_together or sum(p.rows for p in pending) >= RANGE_WRITE_ROWS)
                         and flush(pending, results))

    def _one(self, phase: Phase, part: PartitionRef, compute: Compute, grader: Grader | None,
             pending: list[_Prepared], results: dict[str, Outcome | StormlakeError], *, more: bool = False) -> bool:
        """One partition on its own (its lease waited for, once the partitions held are finished);
        whether the range ends (a transient error)."""
        ended = False

        def before_waiting() -> None:
            nonlocal ended
            ended = self._flush_now(pending, results) or ended

        try:
            prepared = self._prepare(phase, part, compute, grader, before_waiting=before_waiting)
        except StormlakeError as exc:
            self._note(phase, part, exc, results)
            return exc.transient or ended
        except BaseException:
            self.ledger.tell_watchers(phase.name, part.key, "FAILED")
            raise
        if isinstance(prepared, Outcome):
            self._note(phase, part, prepared, results)
            return ended
        return self._hold(prepared, pending, results, more=more) or ended

    def _flush_behind(self, pending: list[_Prepared], results: dict[str, Outcome | StormlakeError]) -> bool:
        """Finish the partitions held in the flusher thread while the step computes its next
        partition; whether the flush before this one ended the range (a transient error).

        A flush is mostly Delta writes in delta-rs and the Parquet encoder, which leave the
        interpreter free, and ledger round trips: the next partition's
        transforms, mostly on the interpreter, run on the other core meanwhile. One flush is in
        flight at a time (the one before is waited for first), so at most the partitions of two
        flushes hold their leases and their tables at once. Each partition still goes through
        the protocol in order (written, recorded, delivered, committed, its lease let go); only
        when it does moves: while the next one computes instead of before. A bug in a flush is
        raised in the step when the flush is waited for.
        """
        ended = self._join_behind()
        if not pending:
            return ended
        # Handed over before they leave ``pending``: an interrupt in between finds them in one of
        # the two (a partition the flush finished is fenced against being let go after it).
        self._behind = _flusher.get().submit(self._flush, list(pending), results)
        pending[:] = []
        return ended

    def _flush_now(self, pending: list[_Prepared], results: dict[str, Outcome | StormlakeError]) -> bool:
        """The flush in flight waited for, then the partitions held finished here; whether either
        ended the range."""
        ended = self._join_behind()
        return self._flush(pending, results) or ended

    def _join_behind(self) -> bool:
        """Wait for the flush in flight; whether it ended the range. A bug in it is raised here."""
        behind = self._behind
        if behind is None:
            return False
        try:
            ended = behind.result()
        except Exception:
            self._behind = None
            raise
        self._behind = None  # an interrupt while waiting leaves it for _settle_behind
        return ended

    def _settle_behind(self) -> None:
        """Wait for the flush in flight while the step is ending on an error of its own (a bug or
        an interrupt): every partition of it is settled by then; a bug of its own is logged."""
        try:
            self._join_behind()
        except Exception as exc:  # noqa: BLE001 - the step's own error is the one raised
            self.log(f"a flush of this step also failed: {exc.__class__.__name__}: {exc}")

    def _note(self, phase: Phase, part: PartitionRef, result: Outcome | StormlakeError,
              results: dict[str, Outcome | StormlakeError]) -> None:
        """A partition's outcome or error, told to the watchers and kept for the step."""
        if isinstance(result, Outcome):
            self.ledger.tell_watchers(phase.name, part.key, result.status, result.delivered)
        else:
            self.ledger.tell_watchers(phase.name, part.key, "FAILED")
        results[part.key] = result

    def _decide_all(self, phase: Phase, group: list[PartitionRef],
                    results: dict[str, Outcome | StormlakeError]) -> tuple[list[_Ready], bool]:
        """Steps 1-3 for a group of partitions (their heads read at once): the ones with work,
        and whether a transient error ends the range. A skip or an error goes to ``results``."""
        heads: dict[str, list[Checkpoint]] | None = None
        if len(group) > 1:
            try:
                heads = {part.key: [] for part in group}
                for cp in self.ledger.heads(list(heads)):
                    heads[cp.partition_key].append(cp)
            except StormlakeError:
                heads = None  # each reads its own, and meets the error itself
        ready: list[_Ready] = []
        for part in group:
            try:
                decided = self._decide(phase, part, None if heads is None else heads[part.key])
            except StormlakeError as exc:
                self._note(phase, part, exc, results)
                if exc.transient:
                    return ready, True
                continue
            except BaseException:
                self.ledger.tell_watchers(phase.name, part.key, "FAILED")
                raise
            if isinstance(decided, Outcome):
                self._note(phase, part, decided, results)
            else:
                ready.append(decided)
        return ready, False

    def _claim_all(self, phase: Phase, ready: list[_Ready], results: dict[str, Outcome | StormlakeError]
                   ) -> tuple[list[_Claimed], list[PartitionRef], bool]:
        """Step 4 for partitions with work: each one's lease taken if it is free (all at once, on
        one ledger session), then their attempts claimed in one transaction
        (:meth:`Ledger.claim_all`). The claimed ones (their leases held), the ones whose lease
        another run holds (left for :meth:`_one`), and whether a transient error ends the range.
        A skip or an error goes to ``results``."""
        leased: list[tuple[_Ready, contextlib.ExitStack]] = []
        busy: list[PartitionRef] = []

        def let_all_go(exc: BaseException | None) -> None:
            for _r, lease in leased:
                _let_go_lease(lease, exc, log=self.log)

        try:
            # Every free lease of the group at once, on one session (Ledger.try_leases).
            for r, taken in zip(ready, self.ledger.try_leases([(r.part.key, phase.name) for r in ready]), strict=True):
                if taken is None:
                    busy.append(r.part)
                    continue
                lease = contextlib.ExitStack()
                lease.enter_context(taken)
                leased.append((r, lease))
            decisions = self.ledger.claim_all([r.args for r, _ in leased]) if leased else []
        except StormlakeError as exc:
            let_all_go(exc)
            # Every partition of the group that is not left to another run's lease meets the error
            # (no lease taken yet when taking them failed): a transient one then fails the step.
            waiting = {part.key for part in busy}
            for r in ready:
                if r.part.key not in waiting:
                    self._note(phase, r.part, exc, results)
            return [], busy, exc.transient
        except BaseException as exc:
            let_all_go(exc)
            raise
        claimed: list[_Claimed] = []
        for (r, lease), decision in zip(leased, decisions, strict=True):
            got = self._claimed_or_skipped(r, decision, lease, "meanwhile")
            if isinstance(got, Outcome):
                self._note(phase, r.part, got, results)
            else:
                claimed.append(got)
        return claimed, busy, False

    def _claimed_or_skipped(self, ready: _Ready, decision: Decision, lease: contextlib.ExitStack,
                            when: str) -> _Claimed | Outcome:
        """A claim's decision under its lease: the attempt claimed (the lease kept), or the skip of
        a phase another run completed ``when`` (the lease let go)."""
        if decision.skip:
            assert decision.head is not None
            lease.close()
            self.outcome_log(f"{ready.phase.name} {ready.part.key}: SKIPPED (completed by another run {when})")
            return Outcome(ready.phase.name, ready.part.key, "SKIPPED", decision.head)
        assert decision.claim is not None
        return _Claimed(ready, decision.claim, lease)

    def _decide(self, phase: Phase, part: PartitionRef, heads: list[Checkpoint] | None = None) -> Outcome | _Ready:
        """Steps 1-3 of the protocol: the partition's skip (recorded), or what its claim needs."""
        ups, prior = self.upstream(phase, part, heads)
        ih, basis = self.input_hash(phase, part, ups, prior)
        args = dict(partition_key=part.key, region_id=part.region.region_id, day=part.day, phase=phase.name,
                    input_hash=ih, schema_version=phase.schema_version, code_version=phase.code_version,
                    run_id=self.run_id)
        if heads is None:
            look = self.ledger.look(**args)
        else:  # the heads were read for a group of partitions just now: the look needs no query
            look = Ledger.look_at(prior, partition_key=part.key, phase=phase.name, input_hash=ih,
                                  schema_version=phase.schema_version)
        self._refuse_dead_letter(phase, part, look.head, ih)
        if look.skip:
            assert look.head is not None
            self.ledger.record_skip(look.head, self.run_id)
            self.outcome_log(f"{phase.name} {part.key}: SKIPPED (checkpoint seq {look.head.seq} has this input hash)")
            return Outcome(phase.name, part.key, "SKIPPED", look.head)
        return _Ready(phase, part, ups, basis, args)

    def _prepare(self, phase: Phase, part: PartitionRef, compute: Compute, grader: Grader | None, *,
                 before_waiting: Callable[[], None]) -> Outcome | _Prepared:
        """Steps 1-5 of the protocol for one partition: its skip, or its attempt computed and
        graded with its lease held (:class:`_Prepared`, finished by :meth:`_flush`); the lease
        waited for if another run holds it (``before_waiting`` called first)."""
        decided = self._decide(phase, part)
        if isinstance(decided, Outcome):
            return decided

        waited_before = False

        def waiting(waited: float) -> None:
            nonlocal waited_before
            if not waited_before:
                waited_before = True
                before_waiting()
            if int(waited * 10) % 50 == 0:
                self.log(f"{phase.name} {part.key}: waiting for the lease held by another run ({waited:.0f} s)")

        lease = contextlib.ExitStack()
        lease.enter_context(self.ledger.lease(part.key, phase.name, timeout_s=self.lease_timeout_s, on_wait=waiting))
        try:
            decision = self.ledger.claim(**decided.args)
        except BaseException as exc:
            lease.__exit__(type(exc), exc, exc.__traceback__)
            raise
        got = self._claimed_or_skipped(decided, decision, lease, "while waiting")
        return got if isinstance(got, Outcome) else self._attempt(got, compute, grader)

    def _attempt(self, c: _Claimed, compute: Compute, grader: Grader | None) -> _Prepared:
        """Step 5 for a claimed partition: computed and graded, its lease held; on an error its
        failure is recorded and its lease let go."""
        phase, part, claim = c.ready.phase, c.part, c.claim
        try:
            _log.info("%s %s: attempt %s (seq %s)", phase.name, part.key, claim.checkpoint.attempt, claim.seq)
            faults.check("after_lease", phase=phase.name, partition_key=part.key)
            if self.force is not None and phase.name == self.force.from_phase:
                # An operator action: recorded with who and why, once per attempt it starts.
                self.ledger.record_action("force", part.key, phase=phase.name, actor=self.force.by,
                                          reason=self.force.reason,
                                          detail={"force_id": self.force.id, "run_id": self.run_id})
            ctx = PhaseContext(self, phase, part, c.ready.ups, claim)
            out, checks, hashing = self._compute(ctx, compute, grader)
        except BaseException as exc:
            self._record_failure(claim, exc)
            c.lease.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return _Prepared(ctx, claim, c.ready.basis, out, checks, hashing, c.lease)

    def _flush(self, pending: list[_Prepared], results: dict[str, Outcome | StormlakeError]) -> bool:
        """Steps 6-8 for the partitions held: their tables written (together when several), their
        writes recorded in one statement (:meth:`_record_writes`), each one's deliveries made,
        their checkpoints committed in one statement (:meth:`Ledger.complete_all`), and their
        leases let go; whether one of them failed with a transient error (the range then ends).

        Every partition held is settled, each alone: COMPLETED, or FAILED with its own error. An
        exception that is not a :class:`StormlakeError` (a bug) is raised once the others are
        settled; an interrupt lets the ones not yet settled go (:meth:`_abandon`). No lease
        stays held on any path.
        """
        if not pending:
            return False
        held, pending[:] = list(pending), []
        unsettled = {id(p): p for p in held}
        bug: Exception | None = None
        transient = False

        def failed(p: _Prepared, exc: Exception) -> None:
            nonlocal bug, transient
            self._record_failure(p.claim, exc)
            del unsettled[id(p)]
            _let_go(p, exc, log=self.log)
            if isinstance(exc, StormlakeError):
                self._note(p.phase, p.part, exc, results)
                transient = transient or exc.transient
            else:
                self.ledger.tell_watchers(p.phase.name, p.part.key, "FAILED")
                if bug is not None:  # the first is raised; the others are in the ledger and here
                    self.log(f"{p.phase.name} of {p.part.key} also failed: {exc.__class__.__name__}: {exc}")
                bug = bug or exc

        try:
            together = self._write_together(held) if len(held) > 1 else {}
            # Each partition's writes (made already when written together), then all of their
            # records in one statement (each fenced on its own attempt), then each one's deliveries.
            writes: list[tuple[_Prepared, MadeCalls]] = []
            for p in held:
                try:
                    made = self._write(p, together)
                    # Written, none of the group's writes recorded yet (fault-injection point).
                    faults.check("after_write", phase=p.phase.name, partition_key=p.part.key)
                    writes.append((p, made))
                except Exception as exc:
                    failed(p, exc)
            recorded = self._record_writes(writes)
            finished: list[tuple[_Prepared, _Finished]] = []
            for (p, made), fenced in zip(writes, recorded, strict=True):
                try:
                    finished.append((p, self._commit(p, made, fenced)))
                except Exception as exc:
                    failed(p, exc)
            # Their checkpoints in one statement (each fenced on its own).
            try:
                committed: list[Checkpoint | Exception] = list(self.ledger.complete_all(
                    [(p.claim, f.state_hash, f.summary, f.tier, f.tier_label) for p, f in finished], self.run_id))
            except Exception as exc:  # the statement as a whole: each partition fails with it
                committed = [exc] * len(finished)
            for (p, f), cp in zip(finished, committed, strict=True):
                phase, part = p.phase, p.part
                if isinstance(cp, Exception):
                    failed(p, cp)
                    continue
                del unsettled[id(p)]
                _let_go(p, None, log=self.log)
                held_for = f", held for review: {f.summary['held']['quality']}" if "held" in f.summary else ""
                self.outcome_log(f"{phase.name} {part.key}: COMPLETED (seq {cp.seq}, state {f.state_hash[:12]}{held_for})")
                outcome = Outcome(phase.name, part.key, "COMPLETED", cp, tuple(f.delivered), tuple(p.checks))
                try:
                    faults.check("after_checkpoint", phase=phase.name, partition_key=part.key)
                except StormlakeError as exc:
                    self._note(phase, part, exc, results)
                    continue
                self._note(phase, part, outcome, results)
        except BaseException:
            self._abandon(list(unsettled.values()))
            raise
        if bug is not None:
            raise bug
        return transient

    def _abandon(self, held: list[_Prepared] | list[_Claimed], *, computed: bool = True) -> None:
        """Let go of partitions claimed but not finished (an interrupt, a bug or a transient error
        ends the step): each recorded FAILED, not counted toward its dead letter, and its lease
        let go. ``computed``: whether they were computed (held for the write together) or only
        claimed."""
        message = ("not finished: the range step was interrupted" if computed
                   else "not started: the range step ended before its turn")
        for p in list(held):
            phase, key = p.phase.name, p.part.key
            try:
                if self.ledger.fail(p.claim, error_class="RangeAbandoned", run_id=self.run_id, counts=False,
                                    error_message=message):  # not when it was finished or taken over
                    self.ledger.tell_watchers(phase, key, "FAILED")
            except Exception as inner:  # noqa: BLE001 - the next one is let go all the same
                self.log(f"could not record the failure in the ledger: {inner}")
            finally:
                _let_go_lease(p.lease, None, log=self.log, what=f"{phase} {key}")
        held.clear()

    def _write_together(self, held: list[_Prepared]) -> dict[tuple[str, str], WriteResult]:
        """Each table of the phase written once for the partitions held that have not written it
        (an earlier attempt's recorded call answers for the others); the write of each, by
        (table, partition key). A table whose write together fails is left out: each partition
        then writes it alone, and a failure stays with its partition."""
        phase = held[0].ctx.phase

        def write(table: str) -> dict[str, WriteResult]:
            todo = [p for p in held if p.call_key(table) not in p.claim.recorded]
            if len(todo) < 2:
                return {}
            writes = [PartitionWrite(p.part.region.region_id, p.part.day, p.out.tables[table],
                                     p.claim.seq, p.claim.checkpoint.first_seq) for p in todo]
            res = self.lake.overwrite_partitions(table, writes, keep=table in LAST_READER)
            return {p.part.key: r for p, r in zip(todo, res, strict=True)}

        together: dict[tuple[str, str], WriteResult] = {}
        for table, res in zip(phase.tables, at_once([partial(write, t) for t in phase.tables]), strict=True):
            if isinstance(res, BaseException):
                self.log(f"{phase.name}: writing {table} for {len(held)} partitions at once failed ({res});"
                         " each writes it alone")
                continue
            together.update({(table, key): r for key, r in res.items()})
        return together

    def _refuse_dead_letter(self, phase: Phase, part: PartitionRef, head: Checkpoint | None, ih: str) -> None:
        """No attempt on inputs that failed :attr:`dead_letter_after` times: they wait for a person."""
        if head is None or head.input_hash != ih or head.status != "FAILED" or head.failures < self.dead_letter_after:
            return
        raise DeadLettered(dead_letter_line(head))

    def _record_failure(self, claim: Claim, exc: BaseException) -> None:
        if isinstance(exc, LedgerUnavailable):
            return  # cannot record; the PENDING row is taken over by the next attempt
        message = str(exc) if isinstance(exc, StormlakeError) else f"{exc.__class__.__name__}: {exc}"
        transient = isinstance(exc, StormlakeError) and exc.transient
        try:
            self.ledger.fail(claim, error_class=exc.__class__.__name__, error_message=message, run_id=self.run_id,
                             counts=not transient)
        except StormlakeError as inner:
            self.log(f"could not record the failure in the ledger: {inner}")

    def _compute(self, ctx: PhaseContext, compute: Compute,
                 grader: Grader | None) -> tuple[PhaseOutput, list[Check], dict[str, Future[str]]]:
        """Steps 4-5: the phase computed and graded; its tables' content hashes, computing in the
        lake's writer threads from the moment the tables are conformed to their schemas (while
        the grader runs and the step goes on; :attr:`_Prepared.hashes` waits for them)."""
        phase, part = ctx.phase, ctx.partition
        out = compute(ctx)
        check_figures(phase.name, phase.schema_version, out.figures, partition_key=part.key)  # before any write
        checks = list(schema_checks(phase, out))  # each table conformed to its schema: what is written
        hashing = {t: in_background(partial(table_hash, out.tables[t])) for t in phase.tables if t in out.tables}
        if grader is not None:
            checks.extend(grader(ctx, out))
        failed = [c for c in checks if not c.passed]
        if failed:
            raise GraderError(
                f"{phase.name} of {part.key} failed its grader: "
                + "; ".join(f"{c.name}: {c.detail}" for c in failed[:3])
            )
        return out, checks, hashing

    def _write(self, p: _Prepared, together: dict[tuple[str, str], WriteResult]) -> MadeCalls:
        """Step 6 for one partition: its writes (made already when ``together`` has them), each a
        call of its own in the phase's table order, not yet recorded (:meth:`_record_writes`)."""
        ctx, claim, out, hashes = p.ctx, p.claim, p.out, p.hashes
        part = ctx.partition

        def write(table: str) -> dict[str, Any]:
            res = together.get((table, part.key)) or self.lake.overwrite_partition(
                table, part.region.region_id, part.day, out.tables[table], seq=claim.seq,
                first_seq=claim.checkpoint.first_seq, keep=table in LAST_READER)
            return {"version": res.version, "written": res.written, "rows": res.rows,
                    "files": None if res.files is None else partition_file_names(res.files, part)}

        return ctx.make_calls("delta_commit", [(table, _write_input(part, hashes[table]), partial(write, table))
                                               for table in ctx.phase.tables])

    def _record_writes(self, writes: list[tuple[_Prepared, MadeCalls]]) -> list[StormlakeError | None]:
        """The writes of the partitions held recorded in one statement (:meth:`Ledger.record_calls`,
        each fenced by its own attempt); for each partition, None or why its records failed (a
        lost lease; the ledger's error, for each partition that had writes to record: one whose
        writes were all answered from the record, or whose first write failed, keeps its own
        outcome)."""
        records = [(i, r) for i, (_p, made) in enumerate(writes) for r in made.records()]
        out: list[StormlakeError | None] = [None] * len(writes)
        if not records:
            return out
        try:
            fenced = self.ledger.record_calls([r for _i, r in records])
        except StormlakeError as exc:  # the statement as a whole: each partition that had records fails with it
            for i, _r in records:
                out[i] = exc
            return out
        for (i, _r), f in zip(records, fenced, strict=True):
            out[i] = out[i] or f
        return out

    def _commit(self, p: _Prepared, made: MadeCalls, fenced: StormlakeError | None) -> _Finished:
        """Step 7 for one partition, its writes recorded (``fenced``: they could not be): its
        deliveries, and the checkpoint it commits (step 8, :meth:`_flush`, with the others held)."""
        ctx, basis, out, checks, hashes = p.ctx, p.basis, p.out, p.checks, p.hashes
        phase, part = ctx.phase, ctx.partition
        rows = {table: out.tables[table].num_rows for table in phase.tables}
        versions: dict[str, int] = {}
        written: dict[str, bool] = {}
        tables = list(phase.tables)
        files: dict[str, list[str]] = {}
        for table, res in zip(tables, made.outputs(fenced), strict=True):
            versions[table] = int(res["version"])
            if res.get("files") is not None:
                files[table] = list(res["files"])
            written[table] = bool(res["written"]) and not res.get("replayed", False)
            faults.check("after_delta_commit", phase=phase.name, partition_key=part.key)
        hold = out.hold if "released" not in basis else None
        delivered, receipts = ([], 0) if hold else deliver(ctx, self.targets, out.artifacts)
        state_hash = hash_json({"tables": hashes, "artifacts": sorted(a.artifact_id for a in out.artifacts)})
        summary = {
            "rows": rows,
            "delta_versions": versions,
            "delta_files": files,
            "delta_written": written,
            "table_hashes": hashes,
            "figures": out.figures,
            "upstream": basis["upstream"],
            "artifacts": sorted(a.artifact_id for a in out.artifacts),
            "delivered": delivered,
            "receipts": receipts,
            "checks": {c.name: c.passed for c in checks},
        }
        if phase.name == "ingest":
            summary["input_files"] = basis["files"]
            summary["input_stamps"] = basis["stamps"]
        if "natural_input_hash" in basis:
            summary["natural_input_hash"] = basis["natural_input_hash"]
        if "released" in basis:
            summary["released"] = basis["released"]
        elif "natural_input_hash" in basis:
            assert self.force is not None
            summary["forced"] = {"from": self.force.from_phase, "by": self.force.by, "reason": self.force.reason,
                                 "id": self.force.id, "run_id": self.run_id}
        tier, label = phase.tier, phase.tier_label
        if hold:
            # Written and committed, delivered to nobody: the partition stays a tier below, held.
            summary["held"] = hold
            tier, label = phase.tier - 1, HELD_LABEL
        check_summary(phase.name, phase.schema_version, summary, partition_key=part.key)  # before the commit
        return _Finished(state_hash, summary, tier, label, tuple(delivered))
