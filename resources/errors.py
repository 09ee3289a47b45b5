"""The project's error classes.

Every error a user or operator can see is one of these, so the CLI can print it as one line
and pick the exit code without a traceback::

    StormlakeError                 base; ``exit_code`` and a one-line ``str()``
    ├── ConfigError                bad settings, region file, CLI usage (exit 2)
    ├── InputFileError             a landing file cannot be read at all (names file, line, field)
    ├── LedgerError                the PostgreSQL ledger
    │   ├── LedgerUnavailable      the server cannot be reached (transient, retried first)
    │   ├── FencingError           this attempt lost its lease; its commit is refused
    │   ├── LeaseTimeout           the phase lease was not granted in time
    │   ├── MigrationError         a schema migration failed; the version is unchanged
    │   └── AccessRefused          the ledger refused a login's action (not a member of the role it needs)
    ├── LakeError                  a Delta table cannot be read or written
    ├── DeliveryError              an artifact could not be delivered
    │   ├── DeliveryRejected       the consumer answered with a status that is not retried
    │   └── DeliveryExhausted      retries ran out (5xx, 429, timeouts)
    ├── GraderError                a phase's output broke its schema or its grader
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


class DeliveryError(StormlakeError):
    """An artifact could not be delivered to a target."""


class DeliveryRejected(DeliveryError):
    """The consumer answered with a status that is not retried (for example 400)."""


class DeliveryExhausted(DeliveryError):
    """Every retry of a delivery failed with 5xx, 429 or a timeout."""

    transient = True


class GraderError(StormlakeError):
    """A phase's output failed its schema check or grader; nothing was committed."""


class InjectedFault(StormlakeError):
    """Raised at a named point by the fault-injection setting ``STORMLAKE_FAULTS``."""
