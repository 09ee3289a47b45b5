"""What a stormlake process prints: set once by each entry point (the CLI, a backfill worker, a
bench child), never on import."""

from __future__ import annotations

import logging
import warnings


def quiet_console() -> None:
    """One line per error on the terminal, not the libraries' chatter.

    The ledger reports connection trouble as one line of its own, so the pool's per-try log lines
    would only repeat it; Dagster's storage retries log warnings on the root logger; the beta
    and preview notices of the Dagster APIs stormlake uses on purpose, and XDG_RUNTIME_DIR
    notices, say nothing to a user.
    """
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    logging.getLogger().setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*is currently in (beta|preview).*")
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
