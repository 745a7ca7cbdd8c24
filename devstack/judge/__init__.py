"""An independent judge of a run: what the provider and the ledger's tables hold, weighed against what
the tickets asked for. It shares no code with the product (no activities/, core/, workflows/, infra/):
the provider is read over its HTTP API, the ledger with plain SQL, Temporal through its client.

Judge only a quiet world: every worker stopped and the longest settle horizon passed
(`wait_until_quiet`), so that nothing the judge reads can still change under it.

    verdict = await judge(tickets, provider_url=..., api_key=..., database=..., client=...)
    print(table(verdict)); verdict.ok
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from temporalio.client import Client

from devstack.judge.checks import weigh
from devstack.judge.ledger import LedgerReader, seconds_until_quiet
from devstack.judge.provider import ProviderReader
from devstack.judge.report import table
from devstack.judge.tasks import alert_times, end_states
from devstack.judge.verdict import Finding, Ticket, Verdict

__all__ = ["Finding", "Ticket", "Verdict", "judge", "table", "wait_until_quiet"]


async def wait_until_quiet(database: str | Path, at_least_until: float = 0.0, margin: float = 0.5) -> float:
    """Sleep until the ledger's longest settle horizon (and `at_least_until`, epoch seconds) has passed;
    returns the seconds slept. Call it after every worker has stopped: a request sent before may still
    land at the provider until its horizon."""
    reader = LedgerReader(database)
    try:
        wait = max(seconds_until_quiet(reader), at_least_until - time.time())
    finally:
        reader.close()
    wait = max(0.0, wait) + margin
    await asyncio.sleep(wait)
    return wait


async def judge(tickets: list[Ticket], *, provider_url: str, api_key: str, database: str | Path,
                client: Client) -> Verdict:
    ledger_reader = LedgerReader(database)
    try:
        ledger = await asyncio.to_thread(ledger_reader.read)
    finally:
        ledger_reader.close()
    provider = await asyncio.to_thread(ProviderReader(provider_url, api_key).read)
    task_ids = [t.task_id for t in tickets]
    ends = await end_states(client, task_ids)
    asked: dict[str, float] = {}
    escalated = sorted({a.task_id for a in ledger.alerts if a.kind == "escalation" and a.task_id in set(task_ids)})
    for task_id in escalated:
        asked.update(await alert_times(client, task_id))
    return weigh(tickets, provider, ledger, ends, asked)
