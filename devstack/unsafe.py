"""The negative control: a straightforward refund tool, as incident 2 had it.

A fresh uuid4 idempotency key per attempt and a bare "refund failed" on any error, so a
timeout after the provider accepted makes the model ask again and the provider pay again.
Registered under the real activity name only by the demo and the tests (`build_worker(replace=...)`);
the product never offers it.
"""

from __future__ import annotations

import asyncio
import uuid

from temporalio import activity

from activities.db import Database
from activities.payments import StripeGateway
from activities.records import Records
from core.models import Outcome, ToolInput, ToolResult
from core.tools import IssueRefundArgs


class UnsafeRefund:
    def __init__(self, records: Records, gateway: StripeGateway) -> None:
        self._records = records
        self._gateway = gateway

    @activity.defn(name="issue_refund")
    async def issue_refund(self, call: ToolInput) -> ToolResult:
        return await asyncio.to_thread(self._refund, call)

    def _refund(self, call: ToolInput) -> ToolResult:
        args = IssueRefundArgs.model_validate(call.arguments)
        record = self._records.order(args.order_id)
        try:
            refund = self._gateway.refund(record.payment_intent_id, args.amount_cents, str(uuid.uuid4()),
                                          {"task_id": call.task_id, "order_id": args.order_id,
                                           "item_id": args.item_id})
        except Exception:
            return ToolResult(tool=call.tool, outcome=Outcome.NOT_PERFORMED, message="refund failed", retryable=True)
        return ToolResult(tool=call.tool, outcome=Outcome.PERFORMED,
                          data={"provider_ref": refund.id, "amount_cents": refund.amount})


def naive_refund(settings) -> object:
    """The naive tool's activity for a worker with these settings."""
    gateway = StripeGateway(settings.stripe_api_key.get_secret_value(), settings.stripe_api_base,
                            settings.stripe_timeout_seconds, settings.stripe_sdk_retries)
    return UnsafeRefund(Records(Database(settings.database)), gateway).issue_refund
