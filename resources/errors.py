"""The project's error classes.

Every error a user or operator can see is one of these, so the CLI can print it as one line
and pick the exit code without a traceback::

    StormlakeError                 base; ``exit_code`` and a one-line ``str()``
    ├── ConfigError                bad settings, region file, CLI usage (exit 2)
    ├── InputFileError             a landing file cannot be read at all (names file, line, field)
    ├── NotLanded                  a partition of a range run has none of its landing files
    ├── LedgerError                the PostgreSQL ledger
    │   ├── LedgerUnavailable      the server cannot be reached (transient, retried first)
    │   ├── FencingError           this attempt lost its lease; its commit is refused
    │   ├── LeaseTimeout           the phase lease was not granted in time
    │   ├── MigrationError         a schema migration failed; the version is unchanged
    │   └── AccessRefused          the ledger refused a login's action (not a member of the role it needs)
    ├── LakeError                  a Delta table cannot be read or written
    ├── StorageError               a landing or publish location (folder, s3://) failed
    ├── DeliveryError              an artifact could not be delivered
    │   ├── DeliveryRejected       the consumer answered with a status that is not retried
    │   └── DeliveryExhausted      retries ran out (5xx, 429, timeouts)
    ├── GraderError                a phase's output broke its schema or its grader
    ├── SummaryRefused             a summary about to be committed does not match its phase's model
    ├── SummaryInvalid             a stored summary does not match its phase's model (names seq, field)
    ├── EventDetailInvalid         a stored event's detail does not match its status's model
    └── InjectedFault              raised by the fault-injection hook (tests only)
"""

from __future__ import annotations


class StormlakeError(Exception):
    """Base of all stormlake errors; ``str()`` is a one-line message for a person."""

    exit_code: int = 1
    #: Whether a retry of the same work may succeed (Dagster's retry policy reads this).
    transient: bool = False

    def __str__(self) -> str:
        text = super().__str__()
        return " ".join(text.split())


class ConfigError(StormlakeError):
    """Settings, the region file or the command line are wrong."""

    exit_code = 2


class InputFileError(StormlakeError):
    """A landing file cannot be read at all; the partition's ingest fails and writes nothing."""

    def __init__(self, path: str, problem: str, *, line: int | None = None, field: str | None = None):
        self.path = path
        self.problem = problem
        self.line = line
        self.field = field
        where = path if line is None else f"{path}:{line}"
        if field:
            where = f"{where} field {field!r}"
        super().__init__(f"{where}: {problem}")


class NotLanded(StormlakeError):
    """A partition of a key range run has none of its landing files while others of the range
    have theirs: nothing can be computed for it, and nothing is recorded of it."""

    def __init__(self, partition_key: str):
        self.partition_key = partition_key
        super().__init__(f"{partition_key} has not landed (no landing files)")


class LedgerError(StormlakeError):
    """The PostgreSQL ledger refused or failed an operation."""


class LedgerUnavailable(LedgerError):
    """The ledger's PostgreSQL server cannot be reached."""

    transient = True


class FencingError(LedgerError):
    """The attempt no longer holds its lease: a newer attempt has claimed the phase."""


class LeaseTimeout(LedgerError):
    """The (partition, phase) lease was not granted within the wait limit."""

    transient = True


class MigrationError(LedgerError):
    """A ledger schema migration failed and was rolled back."""

    exit_code = 2


class AccessRefused(LedgerError):
    """The ledger refused what a login asked (a policy change by a login that is not admin)."""

    exit_code = 2


class LakeError(StormlakeError):
    """A Delta table cannot be read or written."""


class StorageError(StormlakeError):
    """A landing or publish location cannot be listed, read or written (names the URL, never a
    credential). ``transient`` when the store answered with a server error or could not be reached."""

    def __init__(self, message: str, *, transient: bool = False):
        super().__init__(message)
        self.transient = transient


class DeliveryError(StormlakeError):
    """An artifact could not be delivered to a target."""


class DeliveryRejected(DeliveryError):
    """The consumer answered with a status that is not retried (for example 400)."""


class DeliveryExhausted(DeliveryError):
    """Every retry of a delivery failed with 5xx, 429 or a timeout."""

    transient = True


class GraderError(StormlakeError):
    """A phase's output failed its schema check or grader; nothing was committed."""


class SummaryRefused(StormlakeError):
    """A phase's summary does not match its declared model (assets/summaries.py); nothing of the
    partition is committed."""


class SummaryInvalid(StormlakeError):
    """A checkpoint's stored summary does not match its phase's model; the message names the
    partition, the phase, the checkpoint's seq and the field, and the re-run that replaces it."""

    def __init__(self, message: str, *, partition_key: str, phase: str, seq: int, field: str):
        super().__init__(message)
        self.partition_key = partition_key
        self.phase = phase
        self.seq = seq
        self.field = field


class EventDetailInvalid(StormlakeError):
    """A checkpoint event's stored detail does not match the model of its status (assets/summaries.py)."""


class InjectedFault(StormlakeError):
    """Raised at a named point by the fault-injection setting ``STORMLAKE_FAULTS``."""


#: The errors that mean PostgreSQL is gone (the ledger and Dagster's storage share the server), by
#: class name: the ledger's own, psycopg's and its pool's, and SQLAlchemy's wrappers of them.
DB_DOWN_CLASSES = frozenset({"LedgerUnavailable", "OperationalError", "PoolTimeout", "InterfaceError"})


def database_down(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an error it was raised from, says the database is gone: later work would
    fail the same way, so a backfill stops at the first one."""
    seen = exc
    while seen is not None:
        if seen.__class__.__name__ in DB_DOWN_CLASSES:
            return True
        seen = seen.__cause__ or seen.__context__
    return False
