"""What a phase's compute function sees: its partition, its pinned inputs and recorded calls.

A phase module defines ``compute(ctx: PhaseContext) -> PhaseOutput`` and optionally
``grade(ctx, out) -> Iterable[Check]``; the runner (:mod:`assets.runner`) does the rest.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from assets.checks import Check
from assets.hashing import hash_json
from assets.phases import LAST_READER, TABLE_PHASE, Phase
from resources import faults
from resources.errors import ConfigError, StormlakeError
from resources.keys import split_partition_key
from resources.lake import at_once
from resources.ledger import CallRecord
from resources.publisher import Artifact
from resources.settings import Region

if TYPE_CHECKING:
    import pandas as pd

    from assets.runner import PhaseRunner
    from resources.landing import Landing
    from resources.ledger import Checkpoint, Claim, Ledger


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
        day, region_id = split_partition_key(key)
        if region_id not in regions:
            raise ConfigError(f"partition {key!r}: unknown region {region_id!r} (see the region file)")
        return cls(key=key, day=day, region=regions[region_id])


def _partition_folder(part: PartitionRef) -> str:
    return f"region_id={part.region.region_id}/day={part.day}/"


def partition_file_names(paths: Iterable[str], part: PartitionRef) -> list[str]:
    """A partition's data files as a checkpoint records them: the names inside the partition's
    folder (the table's paths without the ``region_id=…/day=…/`` both share), to keep the summary short."""
    folder = _partition_folder(part)
    return [p[len(folder):] if p.startswith(folder) else p for p in paths]


def pinned_files(summary: dict[str, Any], table: str, part: PartitionRef) -> list[str] | None:
    """The data files of ``part`` in ``table`` that a checkpoint's summary pinned (paths relative
    to the table), or None when it does not record them (a checkpoint made before they were)."""
    names = summary.get("delta_files", {}).get(table)
    if names is None:
        return None
    return [n if "/" in n else _partition_folder(part) + n for n in names]


@dataclass
class PhaseOutput:
    tables: dict[str, pa.Table]
    figures: dict[str, Any] = field(default_factory=dict)
    artifacts: list[Artifact] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    #: Why the artifacts must wait for a person before delivery (a noisy batch, :mod:`assets.quality`);
    #: the runner writes the tables and commits, holds the deliveries until a release.
    hold: dict[str, Any] | None = None


class PhaseInputs(ABC):
    """Reading a phase's input tables, the partition's rows of each (subclasses say from where)."""

    phase: Phase

    @abstractmethod
    def read_arrow(self, table: str) -> pa.Table:
        """This partition's rows of an input table of the phase."""

    def read(self, table: str) -> pd.DataFrame:
        # One thread: pyarrow's own pool made the conversion slower, not faster, at every size
        # the phases read, and it takes CPU from the phase's other threads.
        return self.read_arrow(table).to_pandas(use_threads=False)

    def read_inputs(self) -> dict[str, pd.DataFrame]:
        """Every input table of the phase (``Phase.input_tables``), read in their declared order."""
        return {table: self.read(table) for table in self.phase.input_tables}


class PhaseContext(PhaseInputs):
    """What a phase's compute function may touch: pinned upstream reads and recorded calls."""

    def __init__(self, runner: PhaseRunner, phase: Phase, part: PartitionRef, upstream: dict[str, Checkpoint],
                 claim: Claim | None):
        self.runner = runner
        self.phase = phase
        self.partition = part
        self.upstream = upstream
        self.claim = claim

    @property
    def ledger(self) -> Ledger:
        return self.runner.ledger

    @property
    def landing(self) -> Landing:
        return self.runner.landing

    @property
    def known_regions(self) -> list[str]:
        return sorted(self.runner.regions)

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
                                               version=version, files=pinned_files(cp.summary, table, self.partition),
                                               last_use=LAST_READER[table] == self.phase.name)

    def fault_point(self) -> None:
        """Called by a compute function halfway through its work (fault-injection point)."""
        faults.check("mid_transform", phase=self.phase.name, partition_key=self.partition.key)

    def call(self, kind: str, name: str, input: dict[str, Any], fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Make an outside call once per checkpoint: a retried attempt gets the recorded output."""
        return self.call_all(kind, [(name, input, fn)])[0]

    def call_all(self, kind: str, calls: list[tuple[str, dict[str, Any], Callable[[], dict[str, Any]]]]
                 ) -> list[dict[str, Any]]:
        """Several outside calls of one kind, ``(name, input, fn)`` each, made at once
        (:func:`resources.lake.at_once`) and then recorded in one statement, in the given order,
        each as :meth:`call` records it (an earlier attempt's record answers instead). When calls
        fail, the ones that succeeded before the first failure are recorded, then that failure is
        raised; a call that succeeded but is not recorded is made again by the next attempt, so
        ``fn`` must be idempotent (a Delta write is: its app transaction finds the earlier
        commit). One call runs on the calling thread."""
        made = self.make_calls(kind, calls)
        fenced = self.ledger.record_calls(made.records())
        return made.outputs(next((f for f in fenced if f is not None), None))

    def make_calls(self, kind: str, calls: list[tuple[str, dict[str, Any], Callable[[], dict[str, Any]]]]
                   ) -> MadeCalls:
        """The first half of :meth:`call_all`: the calls made (those an earlier attempt recorded
        answered from the record), not yet recorded. A range step records the writes of all the
        partitions it holds in one statement (:meth:`Ledger.record_calls`), then finishes each
        partition's (:meth:`MadeCalls.outputs`)."""
        assert self.claim is not None
        keys = [call_key(kind, name, input) for name, input, _fn in calls]
        todo = [i for i, key in enumerate(keys) if key not in self.claim.recorded]
        made = dict(zip(todo, at_once([calls[i][2] for i in todo]), strict=True))
        return MadeCalls(self, kind, [(name, input) for name, input, _fn in calls], keys, made)


@dataclass
class MadeCalls:
    """Outside calls of one kind an attempt made (:meth:`PhaseContext.make_calls`), to record and
    then hand out: each call's output or exception (``made``, by position), or the earlier
    attempt's record for those not made."""

    ctx: PhaseContext
    kind: str
    calls: list[tuple[str, dict[str, Any]]]  # (name, input), in order
    keys: list[str]
    made: dict[int, dict[str, Any] | BaseException]

    def records(self) -> list[CallRecord]:
        """What to record: every call made before the first one that failed, in order."""
        out: list[CallRecord] = []
        for i, ((name, input), key) in enumerate(zip(self.calls, self.keys, strict=True)):
            output = self.made.get(i)
            if isinstance(output, BaseException):
                break
            if output is not None:
                out.append(CallRecord(self.ctx.claim, key, self.kind, name, input, output))  # type: ignore[arg-type]
        return out

    def outputs(self, fenced: StormlakeError | None) -> list[dict[str, Any]]:
        """Once :meth:`records` are recorded: every call's output in order (a recorded one
        marked ``replayed``), or the first failure raised. ``fenced``: the attempt lost its
        lease before its calls were recorded (raised first)."""
        if fenced is not None:
            raise fenced
        ctx = self.ctx
        assert ctx.claim is not None
        outputs: list[dict[str, Any]] = []
        for i, ((name, _input), key) in enumerate(zip(self.calls, self.keys, strict=True)):
            if i not in self.made:
                ctx.runner.log(f"{ctx.phase.name}: {self.kind} {name} answered from the record")
                outputs.append(dict(ctx.claim.recorded[key], replayed=True))
                continue
            output = self.made[i]
            if isinstance(output, BaseException):
                raise output
            faults.check("after_call", phase=ctx.phase.name, partition_key=ctx.partition.key)
            outputs.append(output)
        return outputs


def call_key(kind: str, name: str, input: dict[str, Any]) -> str:
    """The key a recorded outside call is found by (:meth:`PhaseContext.call_all`)."""
    return f"{kind}:{name}:{hash_json(input)[:16]}"


Compute = Callable[[PhaseContext], PhaseOutput]
Grader = Callable[[PhaseContext, PhaseOutput], Iterable[Check]]
