"""The declared shape of what a checkpoint carries: each phase's summary and the events' details.

A checkpoint's ``summary`` is what the next phase, a resumed run, ``stormlake show`` and the
report read; a ``checkpoint_events`` row's ``detail`` says what happened to it. Both are JSON in
the ledger, and this module is their one schema: a pydantic model per phase and per schema
version of that phase (:attr:`assets.phases.Phase.schema_version`), and one per event status.

- At emission a summary that does not validate stops its phase for that partition: nothing of
  the partition is committed (:func:`check_summary`, called by the runner before the commit).
- At read, wherever a summary is consumed, a stored summary that does not validate is reported
  in one line naming the partition, the phase, the checkpoint's seq and the field, with what to
  run (:func:`read_summary`, :class:`resources.errors.SummaryInvalid`).

Versions: :data:`SUMMARIES` keeps a model for every schema version whose checkpoints may still
be in a ledger. A bump of a phase's ``schema_version`` adds an entry here (the same model when
the summary did not change). A checkpoint of a version with no entry is reported like an
invalid one, with the re-run that replaces it (:data:`RERUN`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, ValidationError

from resources.errors import SummaryInvalid, SummaryRefused


class _Strict(BaseModel):
    """No field a model does not declare: a misspelt key is an error, not a silent extra."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class _Open(BaseModel):
    """Figures a phase may grow; the declared ones must be there and of their type."""

    model_config = ConfigDict(extra="allow", frozen=True)


# ---- what every phase's summary holds --------------------------------------------------------
class Forced(_Strict):
    """A forced re-run (``stormlake backfill --from PHASE --reason TEXT``) that made the checkpoint."""

    from_: str = Field(alias="from")
    by: str
    reason: str
    id: str
    run_id: str | None = None


class Released(_Strict):
    """The operator's release a held present was computed again for (``stormlake release``)."""

    action_id: int
    by: str
    reason: str
    at: str


class Held(_Strict):
    """Why present held its deliveries for review (a noisy batch)."""

    quality: str
    reasons: list[str]


class Summary(_Strict):
    """The summary every phase commits (:meth:`assets.runner.PhaseRunner._commit`)."""

    rows: dict[str, NonNegativeInt]
    delta_versions: dict[str, NonNegativeInt]
    delta_files: dict[str, list[str]] = {}  # absent in checkpoints made before data files were pinned
    delta_written: dict[str, bool] = {}
    table_hashes: dict[str, str] = {}  # absent in checkpoints made before table hashes were kept
    figures: dict[str, Any]
    upstream: dict[str, str]  # phase -> the state hash this checkpoint was computed from
    artifacts: list[str]
    delivered: list[str]
    receipts: NonNegativeInt
    checks: dict[str, bool]
    natural_input_hash: str | None = None
    forced: Forced | None = None
    released: Released | None = None
    held: Held | None = None


# ---- each phase's figures --------------------------------------------------------------------
class FileFigures(_Strict):
    """Row accounting of one landing file (``assets.transforms.ingest.FileReport``)."""

    source_file: str
    rows_read: NonNegativeInt
    rows_accepted: NonNegativeInt
    rows_quarantined: NonNegativeInt
    rows_other_regions: NonNegativeInt = 0
    extra_columns: list[str] = []


class IngestFigures(_Open):
    files: list[FileFigures]
    outages: NonNegativeInt
    weather: NonNegativeInt
    quarantined: NonNegativeInt


class WeatherCoverage(_Strict):
    outages_with_reading: NonNegativeInt
    station_hours: NonNegativeInt
    station_hours_observed: NonNegativeInt


class EnrichFigures(_Open):
    outages: NonNegativeInt
    input_outages: NonNegativeInt
    cells: NonNegativeInt
    customers_out: NonNegativeInt
    weather: WeatherCoverage


class CorrelateFigures(_Open):
    outages: NonNegativeInt
    cell_hours: NonNegativeInt
    cells: NonNegativeInt
    clusters: NonNegativeInt
    clustered_outages: NonNegativeInt
    max_risk: float
    cell_hour_outages: NonNegativeInt


class QualityFigures(_Strict):
    grade: str
    measures: dict[str, float]
    reasons: list[str]


class PresentFigures(_Open):
    outages: NonNegativeInt
    expected_outages: NonNegativeInt
    customers_out: NonNegativeInt
    clusters: NonNegativeInt
    expected_clusters: NonNegativeInt
    backlog: NonNegativeInt
    artifacts: dict[str, str]
    quality: QualityFigures


class IngestSummary(Summary):
    figures: IngestFigures  # type: ignore[assignment]
    input_files: dict[str, str]  # landing file -> its digest
    input_stamps: dict[str, str] = {}  # landing file -> the stamp its digest was taken at (absent in older checkpoints)


class EnrichSummary(Summary):
    figures: EnrichFigures  # type: ignore[assignment]


class CorrelateSummary(Summary):
    figures: CorrelateFigures  # type: ignore[assignment]


class PresentSummary(Summary):
    figures: PresentFigures  # type: ignore[assignment]


#: (phase, schema version) -> the model of its checkpoints' summaries. Present's version 2 changed
#: its table, not its summary.
SUMMARIES: dict[tuple[str, int], type[Summary]] = {
    ("ingest", 1): IngestSummary,
    ("enrich", 1): EnrichSummary,
    ("correlate", 1): CorrelateSummary,
    ("present", 1): PresentSummary,
    ("present", 2): PresentSummary,
}

#: What replaces a phase's stored checkpoint that does not read: a forced re-run from that phase
#: (it and the phases after it compute again on the same inputs; nothing already delivered is
#: delivered twice).
RERUN = "stormlake backfill --regions {region} --days {day}..{day} --from {phase} --reason 'invalid summary'"


# ---- the events' details ---------------------------------------------------------------------
class PendingDetail(_Strict):
    superseded: int | None = None  # the checkpoint id a new input hash superseded, if any


class CompletedDetail(_Strict):
    state_hash: str | None


class FailedDetail(_Strict):
    error_class: str


class SkippedDetail(_Strict):
    pass


#: event status -> the model of its ``detail``.
EVENT_DETAILS: dict[str, type[_Strict]] = {
    "PENDING": PendingDetail,
    "COMPLETED": CompletedDetail,
    "FAILED": FailedDetail,
    "SKIPPED": SkippedDetail,
}

Status = Literal["PENDING", "COMPLETED", "FAILED", "SKIPPED"]


# ---- validation --------------------------------------------------------------------------------
def first_error(exc: ValidationError) -> tuple[str, str]:
    """The first problem of a validation error: its field as a dotted path, and what is wrong."""
    err = exc.errors(include_url=False)[0]
    field = ".".join(str(p) for p in err["loc"]) or "(the whole summary)"
    return field, err["msg"]


def check_summary(phase: str, schema_version: int, summary: dict[str, Any], *, partition_key: str) -> None:
    """Refuse a summary about to be committed that does not match its phase's model
    (:class:`SummaryRefused`, naming the partition, the phase and the field)."""
    model = SUMMARIES.get((phase, schema_version))
    if model is None:
        raise SummaryRefused(f"{phase} of {partition_key}: schema version {schema_version} declares no summary"
                             " model; add it to assets/summaries.py (SUMMARIES)")
    try:
        model.model_validate(summary)
    except ValidationError as exc:
        field, problem = first_error(exc)
        raise SummaryRefused(f"{phase} of {partition_key}: its summary's field {field!r} is invalid ({problem});"
                             " nothing of this partition was committed") from None


def check_figures(phase: str, schema_version: int, figures: dict[str, Any], *, partition_key: str) -> None:
    """Refuse a phase's figures as soon as its transform returns them, before anything of the
    partition is written or delivered (the rest of the summary is the runner's own, checked by
    :func:`check_summary` before the commit)."""
    model = SUMMARIES.get((phase, schema_version))
    if model is None:
        return  # check_summary names the missing model
    figures_model = model.model_fields["figures"].annotation
    assert isinstance(figures_model, type) and issubclass(figures_model, BaseModel)
    try:
        figures_model.model_validate(figures)
    except ValidationError as exc:
        field, problem = first_error(exc)
        raise SummaryRefused(f"{phase} of {partition_key}: its summary's field 'figures.{field}' is invalid"
                             f" ({problem}); nothing of this partition was written or committed") from None


def summary_problem(phase: str, schema_version: int, summary: Any) -> tuple[str, str] | None:
    """Why a stored summary does not read, as (field, problem), or None when it does."""
    model = SUMMARIES.get((phase, schema_version))
    if model is None:
        return "schema_version", f"schema version {schema_version} of {phase} is no longer read"
    if not isinstance(summary, dict):
        return "(the whole summary)", "not a JSON object"
    try:
        model.model_validate(summary)
    except ValidationError as exc:
        return first_error(exc)
    return None


def invalid_summary(*, partition_key: str, phase: str, seq: int, field: str, problem: str) -> SummaryInvalid:
    """The one-line error of a stored summary that does not read, with the re-run that replaces it."""
    day, _, region = partition_key.partition("|")
    return SummaryInvalid(
        f"{phase} of {partition_key} (checkpoint seq {seq}): its stored summary's field {field!r} is invalid"
        f" ({problem}); run `{RERUN.format(region=region, day=day, phase=phase)}`",
        partition_key=partition_key, phase=phase, seq=seq, field=field)


def read_summary(cp: Any) -> dict[str, Any]:
    """A stored checkpoint's summary, checked against its phase's model at its schema version
    (``cp``: a :class:`resources.ledger.Checkpoint`); :class:`SummaryInvalid` if it does not read.

    Only a COMPLETED checkpoint has a summary to read (another has the empty default).
    """
    if cp.status == "COMPLETED":
        problem = summary_problem(cp.phase, cp.schema_version, cp.summary)
        if problem is not None:
            raise invalid_summary(partition_key=cp.partition_key, phase=cp.phase, seq=cp.seq, field=problem[0],
                                  problem=problem[1])
    return cp.summary


def detail_problem(status: str, detail: Any) -> tuple[str, str] | None:
    """Why an event's stored detail does not match its status's model, or None when it does."""
    model = EVENT_DETAILS.get(status)
    if model is None:
        return "status", f"no event status {status!r}"
    try:
        model.model_validate(detail)
    except ValidationError as exc:
        return first_error(exc)
    return None


def summary_schema(phase: str, schema_version: int) -> dict[str, Any]:
    """The JSON Schema of a phase's summary at a schema version (for docs and outside readers)."""
    return SUMMARIES[(phase, schema_version)].model_json_schema(by_alias=True)
