"""The ledger as a Dagster resource (kept apart from :mod:`resources.ledger`, so that the views and
the CLI's read-only commands do not import Dagster)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from resources.ledger import Ledger, get_ledger


class LedgerResource(dg.ConfigurableResource):
    """The ledger as a Dagster resource: ``dsn`` (the pipeline's login) empty means the embedded
    server in ``pgdata``. ``owner_dsn``, when given, migrates the ledger on first use as its owner
    (the contract's one DSN, or the embedded server, whose logins belong to one Unix user)."""

    dsn: str = ""
    owner_dsn: str = ""
    pgdata: str = ""

    def get(self) -> Ledger:
        from resources.logins import embedded_logins

        if self.dsn:
            return get_ledger(self.dsn, owner_dsn=self.owner_dsn or None)
        logins = embedded_logins(Path(self.pgdata))
        return get_ledger(logins.pipeline, owner_dsn=logins.owner)
