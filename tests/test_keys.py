"""Intent keys and the tool registry: pure functions, no servers."""

import json

import pytest
from pydantic import ValidationError

from core.keys import KEY_VERSION, canonical_json, derive_intent_key
from core.models import ToolClass
from core.tools import REGISTRY, IssueRefundArgs, tool_schemas

REFUND = REGISTRY["issue_refund"]
ARGS = {"order_id": "SU-88421", "item_id": "oak-shelf-4", "amount_cents": 11800, "currency": "usd",
        "reason": "arrived damaged"}
CONTEXT = {"task_id": "ticket-SU-88421"}


def key(args=ARGS, context=CONTEXT, spec=REFUND, occurrence=1):
    return derive_intent_key(spec.name, spec.key_fields, args, context, occurrence)


def test_key_is_versioned_and_names_the_tool():
    assert key().startswith(f"{KEY_VERSION}:issue_refund:")


def test_key_ignores_argument_order_and_fields_outside_the_intent():
    shuffled = dict(reversed(list(ARGS.items())))
    reworded = {**ARGS, "reason": "the customer asked again"}
    assert key(shuffled) == key() == key(reworded)


@pytest.mark.parametrize("change", [{"amount_cents": 11700}, {"item_id": "other"}, {"order_id": "SU-1"}])
def test_key_changes_with_every_intent_field(change):
    assert key({**ARGS, **change}) != key()


def test_key_changes_with_the_task():
    assert key(context={"task_id": "ticket-other"}) != key()


def test_payment_key_is_the_invoice_not_the_task():
    pay = REGISTRY["send_payment"]
    args = {"invoice_id": "INV-9", "payee": "ACME", "amount_cents": 420000, "currency": "usd"}
    assert key(args, {"task_id": "a"}, pay) == key(args, {"task_id": "b"}, pay)


def test_occurrence_keys_count_for_tools_without_business_fields():
    args = {"x": 1}
    first = derive_intent_key("tool", (), args, CONTEXT, 1)
    assert first == derive_intent_key("tool", (), {"x": 1}, CONTEXT, 1)
    assert first != derive_intent_key("tool", (), args, CONTEXT, 2)


def test_canonical_json_is_stable():
    assert canonical_json({"b": 1, "a": [2, {"d": 3, "c": 4}]}) == '{"a":[2,{"c":4,"d":3}],"b":1}'


def test_every_write_tool_declares_its_class_and_key_fields():
    for spec in REGISTRY.values():
        assert isinstance(spec.tool_class, ToolClass)
        if spec.tool_class in (ToolClass.MONEY, ToolClass.IRREVERSIBLE):
            assert spec.key_fields, spec.name


def test_schemas_come_from_the_argument_models():
    schemas = {s.name: s for s in tool_schemas()}
    assert set(schemas) == set(REGISTRY)
    refund = schemas["issue_refund"].parameters
    assert refund["properties"]["amount_cents"]["type"] == "integer"
    assert set(refund["required"]) >= {"order_id", "item_id", "amount_cents", "currency"}
    json.dumps(refund)


@pytest.mark.parametrize("amount", [0, -5, 118.0, "11800", 10**12])
def test_refund_amount_must_be_positive_integer_cents(amount):
    with pytest.raises(ValidationError):
        IssueRefundArgs.model_validate({**ARGS, "amount_cents": amount})


def test_refund_rejects_unknown_fields():
    with pytest.raises(ValidationError):
        IssueRefundArgs.model_validate({**ARGS, "approved": True})
