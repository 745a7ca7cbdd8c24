"""Intent keys: one key per business intent, identical on every retry and replay.

A key is a pure function of the facts that make a call one intent. Changing how a key
is derived changes every key, so it needs a new version prefix and a replay-safe path.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

KEY_VERSION = "v1"


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace, so equal facts give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def derive_intent_key(
    tool: str,
    key_fields: tuple[str, ...],
    arguments: dict[str, Any],
    context: dict[str, Any],
    occurrence: int = 1,
    extras: tuple[str, ...] = (),
) -> str:
    """Key from the declared business fields, or from (task, tool, args, occurrence).

    `context` holds facts the model cannot choose (the task id). With no declared
    fields the whole canonical argument set plus the occurrence count is the intent.
    `extras`: optional fields that are part of the intent when given (a message's money
    status): a call without them keeps the key it always had.
    """
    if key_fields:
        facts = {name: context[name] if name in context else arguments[name] for name in key_fields}
        facts.update({name: arguments[name] for name in extras if arguments.get(name) is not None})
    else:
        facts = {"task_id": context["task_id"], "arguments": arguments, "occurrence": occurrence}
    digest = hashlib.sha256(canonical_json({"tool": tool, **facts}).encode()).hexdigest()
    return f"{KEY_VERSION}:{tool}:{digest[:32]}"


def call_signature(tool: str, arguments: dict[str, Any]) -> str:
    """Identity of a call (tool plus canonical arguments), for approvals and occurrences."""
    return hashlib.sha256(canonical_json({"tool": tool, "arguments": arguments}).encode()).hexdigest()[:32]
