"""Asking a person about an intent: the world is read first, in the same attempt as the alert.

A separate read, then an alert one workflow task later, leaves a gap of up to seconds on a busy
worker in which a late request can land: the person would then be asked about something the
provider already shows. Here the gap is the alert's own delivery.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.operations import OperationsActivities
from activities.tools import ToolActivities
from core.failures import AlertNotDelivered
from core.models import AskAnswer, AskInput, IntentView

# Attempts of one ask that read the provider again, rather than ask a person, while it cannot be read (a
# restart, a network blip): with the ops retry policy, 1, 2, 4, 8 and 16 s apart, about half a minute.
# What it holds is what settles the call; a person is asked once it stays unreadable. The deployment's
# setting (UNREADABLE_READS_BEFORE_ASKING); tests that keep the provider unreadable for good lower it.
UNREADABLE_READS = 6


class AskingActivities:
    def __init__(self, tools: ToolActivities, operations: OperationsActivities,
                 unreadable_reads: int = UNREADABLE_READS) -> None:
        self._tools = tools
        self._operations = operations
        self._unreadable_reads = unreadable_reads

    def activities(self) -> list[Callable[..., Any]]:
        return [self.ask_a_person]

    @activity.defn(name="ask_a_person")
    async def ask_a_person(self, ask: AskInput) -> AskAnswer:
        """The world's view of the intent; the alert is delivered only when that view leaves it open.
        A delivery that fails is answered (not raised): the task waits anyway, and the workflow retries
        the alert on its own while the person can already decide."""
        world = await self._tools.inspect_intent(ask.intent)
        if settles(world, ask.not_done_settles):
            if activity.info().attempt > 1:
                await self._withdraw_earlier(ask, world)
            return AskAnswer(world=world, asked=False)
        if world.unreadable and activity.info().attempt < self._unreadable_reads:
            raise ApplicationError(f"nobody asked yet, the provider is read again first: {world.detail}",
                                   type="ProviderUnreadable")
        alert = ask.alert.model_copy(update={"summary": f"{ask.alert.summary} | read {world.read_at}: "
                                                        f"{world.status}: {world.detail}"[:2000]})
        try:
            await self._operations.raise_alert(alert)
        except AlertNotDelivered as err:
            return AskAnswer(world=world, asked=False, failure=str(err))
        return AskAnswer(world=world, asked=True)

    async def _withdraw_earlier(self, ask: AskInput, world: IntentView) -> None:
        """An earlier attempt delivered the question and was lost before it answered (its worker died):
        the person it reached is told the question is withdrawn, as a task withdraws its own."""
        withdrawal = f"{ask.alert.alert_key}:withdrawn"
        asked, withdrawn = await asyncio.to_thread(
            lambda: (self._operations.alert_stored(ask.alert.alert_key), self._operations.alert_stored(withdrawal)))
        if not asked or withdrawn:
            return
        await self._operations.raise_alert(ask.alert.model_copy(update={
            "alert_key": withdrawal, "kind": "escalation_withdrawn",
            "summary": f"{ask.intent.tool} no longer waits for a human: read {world.read_at}: {world.status}: "
                       f"{world.detail}"[:1000]}))


def settles(world: IntentView, not_done_settles: bool) -> bool:
    """No person is asked: the provider holds the effect, a request may still land (ask after its
    horizon), or nothing was done and that answers the call (always when it is so for good)."""
    return world.status == "performed" or (world.status == "in_flight" and world.until is not None) \
        or (world.status == "not_performed" and (not_done_settles or world.final))
