"""`python -m migrations`: bring the ledger's schema (DATABASE_URL, else AGENT_DB_PATH) to the newest
migration, and exit. The compose deployment runs it before the worker starts."""

from __future__ import annotations

import sys

from activities.db import Database
from infra.redact import redact
from infra.settings import load_settings


def main() -> int:
    settings = load_settings()
    try:
        Database(settings.database).create()
    except Exception as err:  # the database is not there yet, or refuses us: one line, and compose retries
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"migrations: {redact(first)}", file=sys.stderr)
        return 1
    print("migrations: the ledger's schema is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
