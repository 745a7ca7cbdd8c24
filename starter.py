"""Starts agent tasks, shows what they did, and carries a person's decisions to them.

    .venv/bin/python starter.py start support T-1001 --order SU-88421 --text "The shelf arrived broken"
    .venv/bin/python starter.py start --file ticket.json     # the same from a JSON file (client/tickets.py)
    .venv/bin/python starter.py batch tickets.jsonl          # one ticket per line
    .venv/bin/python starter.py status ticket-T-1001         # what it did, what it waits for (--details)
    .venv/bin/python starter.py list                         # tasks waiting for a person
    .venv/bin/python starter.py keygen alice@example.com --out ~/.config/agent/alice.pem
    .venv/bin/python starter.py resolve ticket-T-1001 approve --by alice@example.com --key-file alice.pem
    .venv/bin/python starter.py sign ticket-T-1001 approve   # a signed decision for the Web UI's signal form
    .venv/bin/python starter.py redrive ticket-T-1001        # a dead letter, again; done effects not repeated
    .venv/bin/python starter.py reconcile                    # the ledger against the provider now

Every command reads tasks through Temporal. Programs that start tasks from their own ticket system
import the client library instead (client/: `start_ticket`, `follow`, `decide`, `redrive`); the
local stack's demo commands are `python -m devstack ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from cli import decide, inspect, operate, start
from client import ClientError
from infra.codec import PayloadKeyError
from infra.exit import run_main
from infra.redact import redact
from infra.settings import load_settings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="starter.py", description="Start agent tasks and show what they did.",
                                epilog="Configuration comes from the environment; see the README's Configuration.")
    sub = p.add_subparsers(dest="command", required=True)
    for group in (start, inspect, decide, operate):
        group.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    settings = load_settings()
    try:
        return int(asyncio.run(args.run(args, settings)))
    except (ClientError, PayloadKeyError) as err:  # may quote a URL: STRIPE_API_BASE, a provider's error
        print(f"starter: {redact(str(err))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `| head` closed the pipe: the rest of the output has no reader
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("starter: stopped watching; started tasks go on in Temporal", file=sys.stderr)
        return 130


if __name__ == "__main__":
    run_main(main)
