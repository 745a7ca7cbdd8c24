"""A deterministic model that plays the agent in the scenarios.

It reads only its transcript: the ticket text and the tool results. Like a real model it
asks again after a retryable `not_performed`, and with `repeat_effects` it re-requests an
effect that is already done, which is the retry layer no counter sees.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.failures import Decided
from core.models import ChatMessage, ModelReply, ModelTurnInput, ToolCall, ToolSchema

Results = dict[str, dict[str, Any]]
MAX_ASKS = 3


@dataclass(frozen=True)
class PlanStep:
    id: str
    tool: str
    arguments: Callable[[Results], dict[str, Any]]
    repeat: int = 0


class ScriptedModel:
    def reply(self, turn: ModelTurnInput, schemas: list[ToolSchema] | None = None) -> ModelReply:
        if turn.scenario == "long-run":
            return _long_run(turn)
        if turn.turn <= int(turn.model_options.get("bad_calls", 0)):
            return _bad_call(turn.turn)
        if "script_calls" in turn.model_options:
            return _scripted_calls(turn)
        asks, results = _read_transcript(turn.messages)
        brief = next((m.content for m in turn.messages if m.role == "user"), "")
        steps = _plan(turn.scenario, brief, turn.model_options)
        done: Results = {}
        for step in steps:
            step_asks = asks.get(step.id, [])
            if not step_asks:
                return _call(step, done, 1)
            last = results.get(step_asks[-1].id)
            if last is None:
                return _call(step, done, len(step_asks) + 1)
            if _settled(last):
                done[step.id] = last
                settled_count = sum(1 for a in step_asks if _settled(results.get(a.id, {})))
                if settled_count <= step.repeat:
                    return _call(step, done, len(step_asks) + 1)
                continue
            if last.get("retryable") and len(step_asks) < MAX_ASKS:
                return _call(step, done, len(step_asks) + 1)
            if last.get("reason") == Decided.REJECTED_BY_HUMAN:
                return ModelReply(content=f"A human rejected {step.tool}: {last.get('message', '')}. Nothing was done.")
            return _escalate(asks, results, step, last)
        return ModelReply(content=_summary(steps, done))


def _read_transcript(messages: list[ChatMessage]) -> tuple[dict[str, list[ToolCall]], Results]:
    asks: dict[str, list[ToolCall]] = {}
    results: Results = {}
    for message in messages:
        if message.role == "assistant":
            for call in message.tool_calls:
                asks.setdefault(call.id.rsplit("-", 1)[0], []).append(call)
        elif message.role == "tool" and message.tool_call_id:
            results[message.tool_call_id] = json.loads(message.content)
    return asks, results


def _settled(result: dict[str, Any]) -> bool:
    outcome = result.get("outcome")
    if outcome is None:
        return bool(result) and not result.get("reason")
    return outcome in ("performed", "already_performed")


def _call(step: PlanStep, done: Results, ask: int) -> ModelReply:
    arguments = step.arguments(done)
    return ModelReply(tool_calls=[ToolCall(id=f"{step.id}-{ask}", name=step.tool, arguments=json.dumps(arguments))])


def _escalate(asks: dict[str, list[ToolCall]], results: Results, step: PlanStep, last: dict[str, Any]) -> ModelReply:
    if asks.get("escalate"):
        return ModelReply(content=f"I could not complete {step.tool} ({last.get('reason')}); a human has the task.")
    ended = last.get('outcome') or 'with an error'
    reason = f"{step.tool} ended {ended}: {last.get('reason')} {last.get('message', '')}"
    return ModelReply(tool_calls=[ToolCall(id="escalate-1", name="escalate_to_human",
                                           arguments=json.dumps({"reason": reason.strip()}))])


def _summary(steps: list[PlanStep], done: Results) -> str:
    lines = []
    for step in steps:
        result = done.get(step.id, {})
        data = result.get("data", {})
        if step.tool in ("issue_refund", "send_payment"):
            lines.append(f"{step.tool}: {result.get('outcome')} {data.get('amount_cents', 0) / 100:.2f} "
                         f"({data.get('provider_ref')})")
        elif result.get("outcome"):
            lines.append(f"{step.tool}: {result['outcome']}")
    return "Done. " + "; ".join(lines)


def _ids(brief: str, prefix: str) -> list[str]:
    return re.findall(rf"\b{prefix}-\d+(?:-[A-Za-z0-9]+)?\b", brief)


def _order(results: Results) -> dict[str, Any]:
    order: dict[str, Any] = results["lookup"]["data"]  # get_order's data: the order and its amounts
    return order


def _item(results: Results, item_id: str | None) -> dict[str, Any]:
    items = _order(results)["items"]
    return next((i for i in items if i["item_id"] == item_id), items[0])


def _refund(step_id: str, item_id: str | None, repeat: int, options: dict[str, Any]) -> PlanStep:
    def arguments(results: Results) -> dict[str, Any]:
        item = _item(results, item_id)
        return {"order_id": _order(results)["order_id"], "item_id": item["item_id"],
                "amount_cents": options.get("amount_cents", item["amount_cents"]),
                "currency": _order(results)["currency"], "reason": "arrived damaged"}
    return PlanStep(step_id, "issue_refund", arguments, repeat)


# The task kinds `starter.py start` offers play the scenario of the same shape.
_KINDS = {"support": "SU-88421", "refund": "refund-8841", "payables": "INV-9"}


def _fact(brief: str, name: str) -> str | None:
    """A fact the starter wrote under "Facts from our systems:" (`order_id: A-17`), as a model reads it."""
    found = re.search(rf"^{name}: *(\S+(?:, *\S+)*) *$", brief, re.MULTILINE)  # one value, or a list
    return found.group(1) if found else None


def _plan(scenario: str, brief: str, options: dict[str, Any]) -> list[PlanStep]:
    repeat = int(options.get("repeat_effects", 0))
    scenario = _KINDS.get(scenario, scenario)
    if scenario == "INV-9" or _fact(brief, "invoice_id") or _ids(brief, "INV"):
        invoice_id = _fact(brief, "invoice_id") or (_ids(brief, "INV") or ["INV-9"])[0]
        return [
            PlanStep("lookup", "lookup_invoice", lambda r: {"invoice_id": invoice_id}),
            PlanStep("pay", "send_payment", lambda r: {
                "invoice_id": invoice_id, "payee": r["lookup"]["data"]["payee"],
                "amount_cents": r["lookup"]["data"]["amount_cents"],
                "currency": r["lookup"]["data"]["currency"]}, repeat),
            # Money only through payment_status: the product checks it and writes amount and reference.
            PlanStep("remit", "send_email", lambda r: {
                "to": r["lookup"]["data"]["payee_email"], "subject": f"{invoice_id} from Sundry",
                "body": f"Hello {r['lookup']['data']['payee']}, thank you for your work on {invoice_id}.",
                "payment_status": "paid", "invoice_id": invoice_id}),
        ]
    order_id = _fact(brief, "order_id") or (_ids(brief, "SU") or _ids(brief, "ORD") or _ids(brief, "B") or [""])[0]
    # A ticket about several items names them all, comma separated (core/kinds.py): refund each.
    named = [i.strip() for i in (options.get("item_id") or _fact(brief, "item_id") or "").split(",") if i.strip()]
    item_id = named[0] if named else None
    steps = [PlanStep("lookup", "get_order", lambda r: {"order_id": order_id})]
    if scenario == "SU-88421":
        steps.append(PlanStep("policy", "search_policy", lambda r: {"query": "damaged item refund"}))
    steps.append(_refund("refund", item_id, repeat, options))
    for n, extra in enumerate(options.get("extra_refund_items", named[1:]), start=2):
        steps.append(_refund(f"refund{n}", extra, repeat, {}))

    def refunded(r: Results) -> str:
        return f"{r['refund']['data']['amount_cents'] / 100:.2f} {_order(r)['currency'].upper()}"

    # Messages to people state money only through refund_status: the product checks it against the
    # records and writes the amount and the reference itself (core/claims.py).
    if scenario == "SU-88421":
        steps += [
            PlanStep("seller", "message_seller", lambda r: {
                "order_id": order_id, "message": "The customer reported an item of this order arrived damaged; "
                                                 "a courier will collect it.",
                "refund_status": "issued", "item_id": _item(r, item_id)["item_id"]}),
            PlanStep("pickup", "schedule_pickup", lambda r: {"order_id": order_id,
                                                             "item_id": _item(r, item_id)["item_id"]}),
        ]
    elif scenario == "refund-8841":
        steps.append(PlanStep("confirm", "write_confirmation", lambda r: {
            "order_id": order_id, "text": f"Refunded {refunded(r)}, refund {r['refund']['data']['provider_ref']}."}))
    several = len(named) > 1 or bool(options.get("extra_refund_items"))
    steps.append(PlanStep("notify", "notify_customer", lambda r: {
        "order_id": order_id, "message": "We are sorry your order arrived damaged. Thank you for your patience.",
        "refund_status": "issued", **({} if several else {"item_id": _item(r, item_id)["item_id"]})}))
    return steps


def _long_run(turn: ModelTurnInput) -> ModelReply:
    """A long task: a refund, many policy checks, the same refund asked again, a final answer.

    It decides from the turn number and the ticket, not from old tool results, since a long
    transcript reaches the model only as a bounded window.
    """
    turns = int(turn.model_options.get("turns", 100))
    refund = {"order_id": "ORD-8841", "item_id": "kettle-01", "amount_cents": 4500, "currency": "usd",
              "reason": "arrived dented"}
    if turn.turn >= turns:
        return ModelReply(content=f"Done after {turn.turn} turns.")
    if turn.turn in (1, turns - 1):
        return ModelReply(tool_calls=[ToolCall(id=f"t{turn.turn}", name="issue_refund",
                                               arguments=json.dumps(refund))])
    return ModelReply(tool_calls=[ToolCall(id=f"t{turn.turn}", name="search_policy",
                                           arguments=json.dumps({"query": f"check {turn.turn}"}))])


_BAD_CALLS = [
    ToolCall(id="bad", name="refund_everything", arguments="{}"),
    ToolCall(id="bad", name="issue_refund", arguments='{"order_id": "SU-88421", "amount_cents": '),
    ToolCall(id="bad", name="issue_refund", arguments=json.dumps(
        {"order_id": "SU-88421", "item_id": "oak-shelf-4", "amount_cents": "118.00", "currency": "usd",
         "reason": "x", "skip_approval": True})),
]


def _bad_call(turn: int) -> ModelReply:
    """What models get wrong: an unknown tool, truncated JSON, a string amount and an extra field."""
    call = _BAD_CALLS[(turn - 1) % len(_BAD_CALLS)]
    return ModelReply(tool_calls=[call.model_copy(update={"id": f"bad-{turn}"})])


def _scripted_calls(turn: ModelTurnInput) -> ModelReply:
    """Exactly the calls a test gives, one per turn (or a list of calls for one turn, as a hostile model
    sends them all at once), whatever the results; then a final answer."""
    calls = turn.model_options["script_calls"]
    if turn.turn > len(calls):
        return ModelReply(content="I have done what I was told.")
    entry = calls[turn.turn - 1]
    if isinstance(entry, dict):
        return ModelReply(tool_calls=[ToolCall(id=f"s{turn.turn}", name=entry["name"], arguments=entry["arguments"])])
    return ModelReply(tool_calls=[ToolCall(id=f"s{turn.turn}.{n}", name=c["name"], arguments=c["arguments"])
                                  for n, c in enumerate(entry, start=1)])
