"""Validation of a model's tool call against the registry: pure, so the workflow and the
property tests use the same function. Never raises on what a model sends."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from core.bounds import MAX_ARGUMENT_CHARS, MAX_ARGUMENTS_CHARS, TRUNCATED
from core.failures import Unusable
from core.models import Approval, Step
from core.tools import REGISTRY, ToolSpec


@dataclass(frozen=True)
class Rejection:
    """Why a call cannot run (core/failures.py)."""

    reason: Unusable
    message: str


@dataclass
class GateCall:
    """One validated tool call on its way through the workflow's gate. Declared here, outside the
    workflow module, so the sandbox does not build the class again for every workflow run."""

    spec: ToolSpec
    arguments: dict[str, Any]
    key: str | None  # the intent key; None for reads
    decision_key: str  # what a human decision names: the intent key, or a read's call signature
    step: Step
    approval: Approval | None = None


@dataclass(frozen=True)
class Refused:
    """A human's mark_performed / mark_not_performed that the provider's records contradict."""

    why: str


def validate_call(name: str, arguments: str | None,
                  offered: list[str] | None = None) -> tuple[ToolSpec, dict[str, Any]] | Rejection:
    """The tool and its validated arguments, or why not. `offered` are the task's tools (all if None)."""
    spec = REGISTRY.get(name)
    tools = sorted(REGISTRY) if offered is None else sorted(offered)
    if spec is None:
        return Rejection(Unusable.UNKNOWN_TOOL, f"no tool named {name[:80]!r}; tools: {tools}")
    if name not in tools:
        return Rejection(Unusable.NOT_OFFERED, f"{name} is not a tool of this task; tools: {tools}")
    text = arguments or "{}"
    if len(text) > MAX_ARGUMENT_CHARS:
        return Rejection(Unusable.MALFORMED_ARGUMENTS,
                         f"arguments are {len(text)} characters; at most {MAX_ARGUMENT_CHARS}")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as err:
        return Rejection(Unusable.MALFORMED_ARGUMENTS, f"arguments are not valid JSON: {str(err)[:200]}")
    if not isinstance(raw, dict):
        return Rejection(Unusable.MALFORMED_ARGUMENTS, "arguments must be a JSON object")
    if TRUNCATED in raw:  # cut where the reply entered (core/bounds.py)
        return Rejection(Unusable.MALFORMED_ARGUMENTS,
                         f"arguments were {raw[TRUNCATED]} characters; at most {MAX_ARGUMENT_CHARS} per call and "
                         f"{MAX_ARGUMENTS_CHARS:,} per reply")
    try:
        return spec, spec.args.model_validate(raw).model_dump(mode="json")
    except ValidationError as err:
        errors = [{"field": ".".join(map(str, e["loc"])), "error": e["msg"]} for e in err.errors()]
        return Rejection(Unusable.INVALID_ARGUMENTS, json.dumps(errors)[:2000])
    except (ValueError, TypeError, RecursionError) as err:
        return Rejection(Unusable.INVALID_ARGUMENTS, str(err)[:200])
