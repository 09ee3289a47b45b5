"""The one phase runner all four assets use: the phase protocol of docs/DESIGN.md.

1. input hash  2. decide (skip?)  3. lease + claim  4. compute on pinned inputs
5. grade  6. idempotent Delta writes  7. deliveries with receipts  8. checkpoint commit
On any error: FAILED with the error, in its own transaction, then re-raise.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pyarrow as pa

from assets.phases import LAST_READER, TABLE_PHASE, Phase
from assets.schemas import PARTITION_COLUMNS, SCHEMAS
from resources import faults
from resources.errors import GraderError, LedgerUnavailable, StormlakeError
from resources.lake import Lake
from resources.landing import Landing
from resources.ledger import Checkpoint, Claim, Ledger, Receipt
from resources.publisher import Artifact, Target
from resources.settings import Region

Log = Callable[[str], None]
_log = logging.getLogger("stormlake.runner")

#: Callables told of every phase outcome in this process: (phase, partition_key, status,
#: delivered artifact ids). The CLI's progress display listens here while a run executes.
OUTCOME_LISTENERS: list[Callable[[str, str, str, tuple[str, ...]], None]] = []


def _notify(phase: str, key: str, status: str, delivered: tuple[str, ...] = ()) -> None:
    for listener in list(OUTCOME_LISTENERS):
        listener(phase, key, status, delivered)


class UpstreamNotReady(StormlakeError):
    """An earlier phase of the partition has no COMPLETED checkpoint yet."""


class UpstreamOutdated(UpstreamNotReady):
    """An earlier phase's COMPLETED checkpoint was made by another schema or code version of it."""


class UndeclaredRead(StormlakeError):
    """A phase read a table its :class:`Phase` does not declare among its inputs (a code error)."""


@dataclass(frozen=True)
class PartitionRef:
    key: str  # Dagster's multi-partition key: 'YYYY-MM-DD|region_id'
    day: str
    region: Region

    @classmethod
    def parse(cls, key: str, regions: dict[str, Region]) -> PartitionRef:
        from resources.errors import ConfigError

        day, _, region_id = key.partition("|")
        if region_id not in regions:
            raise ConfigError(f"partition {key!r}: unknown region {region_id!r} (see the region file)")
        return cls(key=key, day=day, region=regions[region_id])


@dataclass(frozen=True)
class Check:
    """One grader finding; a phase commits only when every check passed."""

    name: str
    passed: bool
    detail: str = ""


@dataclass
class PhaseOutput:
    tables: dict[str, pa.Table]
    figures: dict[str, Any] = field(default_factory=dict)
    artifacts: list[Artifact] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)


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


def table_hash(table: pa.Table) -> str:
    """Content hash of a table: sha256 over its schema and each column's Arrow buffers.

    Columns are combined into one chunk with no offset first, so the same values always give
    the same buffers; hashing the buffers in place avoids serialising a copy of the table.
    """
    h = hashlib.sha256(table.schema.to_string().encode())
    h.update(str(table.num_rows).encode())
    for column in table.columns:
        chunks = column.chunks
        array = chunks[0] if len(chunks) == 1 else column.combine_chunks()
        if len(chunks) == 0:
            continue
        if array.offset:
            array = pa.concat_arrays([array])  # materialise a sliced array at offset 0
        _hash_array(h, array)
    return h.hexdigest()


def _hash_array(h: Any, array: pa.Array) -> None:
    h.update(b"|")
    for buf in array.buffers():
        if buf is None:
            h.update(b"-")
        else:
            h.update(memoryview(buf))
    # Nested types (list<string>) carry their children's buffers in array.buffers() already.


def _hash_json(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class PhaseContext:
    """What a phase's compute function may touch: pinned upstream reads and recorded calls."""

    def __init__(self, runner: PhaseRunner, phase: Phase, part: PartitionRef, upstream: dict[str, Checkpoint],
                 claim: Claim | None):
        self.runner = runner
        self.phase = phase
        self.partition = part
        self.upstream = upstream
        self.claim = claim

    @property
    def landing(self) -> Landing:
        return self.runner.landing

    @property
    def known_regions(self) -> list[str]:
        return sorted(self.runner.regions)

    def read(self, table: str) -> pd.DataFrame:
        return self.read_arrow(table).to_pandas()

    def read_arrow(self, table: str) -> pa.Table:
        """Read this partition of ``table`` at the version its producer's checkpoint pinned."""
        if table not in self.phase.input_tables:
            raise UndeclaredRead(f"{self.phase.name} reads {table}, which is not among its declared inputs"
                                 f" ({', '.join(self.phase.input_tables) or 'none'}; see assets/phases.py)")
        owner = TABLE_PHASE[table]
        cp = self.upstream.get(owner)
        if cp is None:
            raise UpstreamNotReady(f"{self.phase.name} of {self.partition.key} reads {table} but {owner} is not done")
        version = cp.summary["delta_versions"][table]
        return self.runner.lake.read_partition(table, self.partition.region.region_id, self.partition.day,
                                               version=version, last_use=LAST_READER[table] == self.phase.name)

    def fault_point(self) -> None:
        """Called by a compute function halfway through its work (fault-injection point)."""
        faults.check("mid_transform", phase=self.phase.name, partition_key=self.partition.key)

    def call(self, kind: str, name: str, input: dict[str, Any], fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Make an outside call once per checkpoint: a retried attempt gets the recorded output."""
        assert self.claim is not None
        key = f"{kind}:{name}:{_hash_json(input)[:16]}"
        if key in self.claim.recorded:
            self.runner.log(f"{self.phase.name}: {kind} {name} answered from the record")
            return dict(self.claim.recorded[key], replayed=True)
        output = fn()
        self.runner.ledger.record_call(self.claim, call_key=key, kind=kind, name=name, input=input, output=output)
        faults.check("after_call", phase=self.phase.name, partition_key=self.partition.key)
        return output


def _recorded_files(cp: Checkpoint | None) -> dict[str, tuple[str, str]]:
    """(stamp, digest) per landing file as an ingest checkpoint recorded them (none if it did not)."""
    summary = (cp.summary or {}) if cp is not None else {}
    files, stamps = summary.get("input_files") or {}, summary.get("input_stamps") or {}
    return {rel: (stamps[rel], digest) for rel, digest in files.items() if rel in stamps}


_FROZEN: list[bool] = []


def freeze_startup_heap() -> None:
    """Move what the process holds before its first phase (Dagster, its definitions, the
    imported libraries) out of the garbage collector's sight, once per process.

    Those objects live as long as the process; without this every full collection triggered by
    a phase's allocations walks all of them again (``gc.freeze``, Python 3.7+). Objects made
    afterwards are collected as usual.
    """
    if not _FROZEN:
        _FROZEN.append(True)
        gc.freeze()


Compute = Callable[[PhaseContext], PhaseOutput]
Grader = Callable[[PhaseContext, PhaseOutput], Iterable[Check]]


class PhaseRunner:
    """Runs phases for partitions against one ledger, lake, landing zone and target set."""

    def __init__(self, *, ledger: Ledger, lake: Lake, landing: Landing, targets: list[Target],
                 regions: dict[str, Region], run_id: str | None = None, log: Log | None = None,
                 lease_timeout_s: float = 900.0):
        self.ledger = ledger
        self.lake = lake
        self.landing = landing
        self.targets = targets
        self.regions = regions
        self.run_id = run_id
        self.log: Log = log or (lambda _msg: None)
        self.lease_timeout_s = lease_timeout_s
        freeze_startup_heap()

    # ---- 1. input hash -----------------------------------------------------------------
    def upstream(self, phase: Phase, part: PartitionRef) -> tuple[dict[str, Checkpoint], Checkpoint | None]:
        """The COMPLETED head checkpoints of the phases ``phase`` reads, and ``phase``'s own head.

        Each must come from the current schema and code version of its phase: a selection that
        leaves an upgraded phase out (``--select operational_picture`` after a schema bump of
        correlate) would otherwise compute on tables of the old shape.
        """
        from assets.phases import BY_NAME

        heads = {cp.phase: cp for cp in self.ledger.heads([part.key])}
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
            ups[name] = cp
        return ups, heads.get(phase.name)

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
        ih = _hash_json(basis)
        if stamps:
            basis["stamps"] = stamps  # recorded by ingest, not hashed
        return ih, basis

    def _would_skip(self, phase: Phase, part: PartitionRef, heads: dict[str, Checkpoint]) -> bool:
        """Whether ``phase`` would skip given the partition's head checkpoints (as :meth:`run` decides)."""
        cp = heads.get(phase.name)
        if cp is None or cp.status != "COMPLETED" or cp.schema_version != phase.schema_version:
            return False
        if any(name not in heads for name in phase.upstream_phases):
            return False
        return self.input_hash(phase, part, {name: heads[name] for name in phase.upstream_phases}, prior=cp)[0] == cp.input_hash

    def prefetch(self, phase: Phase, part: PartitionRef) -> None:
        """Start reading the partition's inputs for ``phase`` in the background, if it has work.

        Called by a range step for the next partition while it computes the current one, and
        by the CLI for the first partition of a run it is about to launch. Only
        when every upstream phase is COMPLETED and this phase would not skip; any doubt (the
        ledger unreachable) just means no prefetch: the phase reads as usual.
        """
        if not phase.input_tables:
            return
        try:
            heads = {cp.phase: cp for cp in self.ledger.heads([part.key])}
            if (any(name not in heads or heads[name].status != "COMPLETED" for name in phase.upstream_phases)
                    or self._would_skip(phase, part, heads)):
                return
        except StormlakeError:
            return
        for table in phase.input_tables:
            version = heads[TABLE_PHASE[table]].summary["delta_versions"][table]
            self.lake.prefetch(table, part.region.region_id, part.day, version=version)

    # ---- the protocol ------------------------------------------------------------------
    def current_heads(self, part: PartitionRef) -> list[Checkpoint]:
        """The head checkpoints of the phases, from the first, that would skip as the partition stands.

        Uses the same input hashes as :meth:`run`, so it never disagrees with what a run would
        decide. A caller (the CLI, the sensors) launches no run when every phase would skip,
        and leaves the leading ones out of the run it launches (a resumed partition runs from
        the phase that did not finish, not through steps that can only skip).
        """
        from assets.phases import PHASES

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
        from assets.phases import PHASES

        current = self.current_heads(part)
        if len(current) < len(PHASES):
            return False
        self.record_skips(current)
        return True

    def run(self, phase: Phase, part: PartitionRef, compute: Compute, grader: Grader | None = None) -> Outcome:
        try:
            outcome = self._run(phase, part, compute, grader)
        except BaseException:
            _notify(phase.name, part.key, "FAILED")
            raise
        _notify(phase.name, part.key, outcome.status, outcome.delivered)
        return outcome

    def _run(self, phase: Phase, part: PartitionRef, compute: Compute, grader: Grader | None) -> Outcome:
        ups, prior = self.upstream(phase, part)
        ih, basis = self.input_hash(phase, part, ups, prior)
        args = dict(partition_key=part.key, region_id=part.region.region_id, day=part.day, phase=phase.name,
                    input_hash=ih, schema_version=phase.schema_version, code_version=phase.code_version,
                    run_id=self.run_id)
        look = self.ledger.look(**args)
        if look.skip:
            assert look.head is not None
            self.ledger.record_skip(look.head, self.run_id)
            self.log(f"{phase.name} {part.key}: SKIPPED (checkpoint seq {look.head.seq} has this input hash)")
            return Outcome(phase.name, part.key, "SKIPPED", look.head)

        def waiting(waited: float) -> None:
            if int(waited * 10) % 50 == 0:
                self.log(f"{phase.name} {part.key}: waiting for the lease held by another run ({waited:.0f} s)")

        with self.ledger.lease(part.key, phase.name, timeout_s=self.lease_timeout_s, on_wait=waiting):
            decision = self.ledger.claim(**args)
            if decision.skip:
                assert decision.head is not None
                self.log(f"{phase.name} {part.key}: SKIPPED (completed by another run while waiting)")
                return Outcome(phase.name, part.key, "SKIPPED", decision.head)
            claim = decision.claim
            assert claim is not None
            _log.info("%s %s: attempt %s (seq %s)", phase.name, part.key, claim.checkpoint.attempt, claim.seq)
            faults.check("after_lease", phase=phase.name, partition_key=part.key)
            try:
                outcome = self._attempt(phase, part, ups, claim, basis, compute, grader)
            except BaseException as exc:
                self._record_failure(claim, exc)
                raise
        faults.check("after_checkpoint", phase=phase.name, partition_key=part.key)
        return outcome

    def _record_failure(self, claim: Claim, exc: BaseException) -> None:
        if isinstance(exc, LedgerUnavailable):
            return  # cannot record; the PENDING row is taken over by the next attempt
        message = str(exc) if isinstance(exc, StormlakeError) else f"{exc.__class__.__name__}: {exc}"
        try:
            self.ledger.fail(claim, error_class=exc.__class__.__name__, error_message=message, run_id=self.run_id)
        except StormlakeError as inner:
            self.log(f"could not record the failure in the ledger: {inner}")

    def _attempt(self, phase: Phase, part: PartitionRef, ups: dict[str, Checkpoint], claim: Claim,
                 basis: dict[str, Any], compute: Compute, grader: Grader | None) -> Outcome:
        ctx = PhaseContext(self, phase, part, ups, claim)
        out = compute(ctx)
        checks = list(_schema_checks(phase, out))
        if grader is not None:
            checks.extend(grader(ctx, out))
        failed = [c for c in checks if not c.passed]
        if failed:
            raise GraderError(
                f"{phase.name} of {part.key} failed its grader: "
                + "; ".join(f"{c.name}: {c.detail}" for c in failed[:3])
            )
        versions: dict[str, int] = {}
        written: dict[str, bool] = {}
        hashes: dict[str, str] = {}
        rows: dict[str, int] = {}
        for table in phase.tables:
            data = out.tables[table]
            hashes[table] = table_hash(data)
            rows[table] = data.num_rows

            def write(table: str = table, data: pa.Table = data) -> dict[str, Any]:
                res = self.lake.overwrite_partition(table, part.region.region_id, part.day, data,
                                                    seq=claim.seq, first_seq=claim.checkpoint.first_seq,
                                                    keep=table in LAST_READER)
                return {"version": res.version, "written": res.written, "rows": res.rows}

            res = ctx.call("delta_commit", table, {"partition": part.key, "content": hashes[table]}, write)
            versions[table] = int(res["version"])
            written[table] = bool(res["written"]) and not res.get("replayed", False)
            faults.check("after_delta_commit", phase=phase.name, partition_key=part.key)
        delivered, receipts = self._deliver(ctx, out.artifacts)
        state_hash = _hash_json({"tables": hashes, "artifacts": sorted(a.artifact_id for a in out.artifacts)})
        summary = {
            "rows": rows,
            "delta_versions": versions,
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
        cp = self.ledger.complete(claim, state_hash=state_hash, summary=summary, tier=phase.tier,
                                  tier_label=phase.tier_label, run_id=self.run_id)
        self.log(f"{phase.name} {part.key}: COMPLETED (seq {cp.seq}, state {state_hash[:12]})")
        return Outcome(phase.name, part.key, "COMPLETED", cp, tuple(delivered), tuple(checks))

    # ---- deliveries ----------------------------------------------------------------------
    def _deliver(self, ctx: PhaseContext, artifacts: list[Artifact]) -> tuple[list[str], int]:
        """Deliver every artifact to every target exactly once, guarded by receipts."""
        delivered: list[str] = []
        count = 0
        part = ctx.partition
        for artifact in artifacts:
            for target in self.targets:
                count += 1
                rec = self.ledger.prepare_receipt(
                    artifact_id=artifact.artifact_id, target=target.name, partition_key=part.key,
                    region_id=artifact.region_id, day=artifact.day, kind=artifact.kind,
                    content_hash=artifact.content_hash, size_bytes=len(artifact.data),
                    target_ref=target.ref(artifact), checkpoint_id=ctx.claim.id if ctx.claim else None,
                )
                if rec.status == "DELIVERED":
                    continue
                faults.check("after_pending", phase=ctx.phase.name, partition_key=part.key)

                def send(target: Target = target, artifact: Artifact = artifact, rec: Receipt = rec):
                    try:
                        response = target.deliver(artifact, supersedes=rec.supersedes,
                                                  idempotency_key=rec.idempotency_key)
                    except StormlakeError as exc:
                        self.ledger.note_delivery_attempt(rec, str(exc))
                        raise
                    faults.check("after_delivery", phase=ctx.phase.name, partition_key=part.key)
                    self.ledger.mark_delivered(rec, response)
                    return {"artifact_id": artifact.artifact_id, "target": target.name,
                            "idempotency_key": rec.idempotency_key, "response": response}

                ctx.call("deliver", f"{target.name}:{artifact.kind}",
                        {"artifact_id": artifact.artifact_id, "target": target.name,
                         "idempotency_key": rec.idempotency_key}, send)
                delivered.append(f"{target.name}:{rec.idempotency_key}")
                _log.info("delivered %s to %s%s", rec.idempotency_key, target.name,
                          f" (supersedes {rec.supersedes})" if rec.supersedes else "")
        return delivered, count


def _schema_checks(phase: Phase, out: PhaseOutput) -> Iterable[Check]:
    """Every table a phase hands on has exactly its declared columns, types and partition."""
    for table in phase.tables:
        data = out.tables.get(table)
        if data is None:
            yield Check(f"{table}.present", False, "the phase produced no such table")
            continue
        schema = SCHEMAS[table]
        missing = [n for n in schema.names if n not in data.schema.names]
        if missing:
            yield Check(f"{table}.columns", False, f"missing column(s) {', '.join(missing)}")
            continue
        try:
            cast = data.select(schema.names).cast(schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as exc:
            yield Check(f"{table}.types", False, str(exc).splitlines()[0])
            continue
        bad_nulls = [f.name for f in schema if not f.nullable and cast.column(f.name).null_count]
        if bad_nulls:
            yield Check(f"{table}.nulls", False, f"nulls in non-nullable column(s) {', '.join(bad_nulls)}")
        yield Check(f"{table}.schema", not bad_nulls, f"{cast.num_rows} rows")
        for col in PARTITION_COLUMNS:
            values = set(cast.column(col).unique().to_pylist())
            if len(values) > 1:
                yield Check(f"{table}.{col}", False, f"rows of several partitions: {sorted(values)[:3]}")
        out.tables[table] = cast
