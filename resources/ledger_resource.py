"""The ledger as a Dagster resource (kept apart from :mod:`resources.ledger`, so that the views and
the CLI's read-only commands do not import Dagster)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from resources.ledger import Ledger, get_ledger


class LedgerResource(dg.ConfigurableResource):
    """The ledger as a Dagster resource: ``dsn`` empty means the embedded server in ``pgdata``."""

    dsn: str = ""
    pgdata: str = ""

    def get(self) -> Ledger:
        from resources.pgserver import resolve_dsns

        if self.dsn:
            return get_ledger(self.dsn)
        ledger_dsn, _ = resolve_dsns(None, Path(self.pgdata))
        return get_ledger(ledger_dsn)
