"""Columns of the matrix: a model backend and the tools it is given.

    scripted                the deterministic model, our tools
    naive                   the scripted model with devstack/unsafe.py's refund tool: the baseline
    openai:MODEL            OpenAI-compatible Chat Completions (OPENAI_API_KEY, OPENAI_BASE_URL)
    anthropic:MODEL         Anthropic Messages (ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL)
    claims-unasked          a seeded defect: the scripted model that tells of a refund (or payment)
                            it never asked for

A baseline column is graded like any other and reported, but its failures are what it is there
to show: they never make the command fail.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable

from activities.model import ModelBackend, ScriptedBackend, make_backend
from activities.scripted import ScriptedModel
from core.models import ChatMessage, ModelReply, ModelTurnInput, ToolSchema
from devstack.unsafe import naive_refund
from infra.settings import Settings

__all__ = ["Column", "ClaimsUnaskedBackend", "default_columns", "parse_column"]

MONEY_TOOLS = ("issue_refund", "send_payment")


@dataclass(frozen=True)
class Column:
    spec: str
    backend_name: str = "scripted"
    model_name: str | None = None
    naive_tool: bool = False
    baseline: bool = False
    about: str = ""

    @property
    def name(self) -> str:
        return self.spec.replace(":", "-")

    def backend(self, settings: Settings) -> ModelBackend:
        if self.backend_name == "claims-unasked":
            return ClaimsUnaskedBackend()
        if self.backend_name == "scripted":
            return ScriptedBackend()
        return make_backend(self.backend_name, self.model_name, timeout_seconds=settings.model_timeout_seconds,
                            max_tokens=settings.model_max_tokens)

    def replace(self, settings: Settings) -> list[Callable]:
        return [naive_refund(settings)] if self.naive_tool else []


def parse_column(spec: str) -> Column:
    """A column from its spec (see the module doc); ValueError with the reason."""
    name, _, model = spec.partition(":")
    if name == "scripted" and not model:
        return Column(spec, about="scripted model, our tools")
    if name == "naive" and not model:
        return Column(spec, naive_tool=True, baseline=True, about="scripted model, naive refund tool (baseline)")
    if name == "claims-unasked" and not model:
        return Column(spec, backend_name="claims-unasked", about="seeded defect: claims a refund it never asked for")
    if name in ("openai", "anthropic"):
        if not model:
            raise ValueError(f"column {spec!r} needs a model id: {name}:MODEL")
        key = "OPENAI_API_KEY" if name == "openai" else "ANTHROPIC_API_KEY"
        if not os.environ.get(key):
            raise ValueError(f"column {spec!r} needs {key} in the environment")
        return Column(spec, backend_name=name, model_name=model, about=f"{name} {model}, our tools")
    raise ValueError(f"unknown column {spec!r}; use scripted, naive, claims-unasked, openai:MODEL or anthropic:MODEL")


def default_columns() -> list[Column]:
    """scripted and the naive baseline, plus each real backend whose key and EVAL_*_MODEL are set."""
    specs = ["scripted", "naive"]
    for name in ("openai", "anthropic"):
        model = os.environ.get(f"EVAL_{name.upper()}_MODEL")
        if model and os.environ.get(f"{name.upper()}_API_KEY"):
            specs.append(f"{name}:{model}")
    return [parse_column(s) for s in specs]


class ClaimsUnaskedBackend:
    """The scripted model, except that it never asks for the money effect: it behaves as if the
    money tool had answered `performed`, and so tells the customer of a refund nobody made.

    The answer it imagines is kept out of the real transcript: each turn it replays the scripted
    model on the real transcript plus one invented call and result per money step.
    """

    def __init__(self) -> None:
        self._model = ScriptedModel()

    async def reply(self, turn: ModelTurnInput, schemas: list[ToolSchema]) -> ModelReply:
        messages = list(turn.messages)
        for _ in range(8):  # one invented answer per money step of the plan, at most
            reply = self._model.reply(turn.model_copy(update={"messages": messages}), schemas)
            money = [c for c in reply.tool_calls if c.name in MONEY_TOOLS]
            if not money:
                return reply
            for call in money:
                amount = json.loads(call.arguments).get("amount_cents", 0)
                invented = {"tool": call.name, "outcome": "performed",
                            "data": {"amount_cents": amount, "provider_ref": None}}
                messages += [ChatMessage(role="assistant", tool_calls=[call]),
                             ChatMessage(role="tool", tool_call_id=call.id, content=json.dumps(invented))]
        return ModelReply(content="I could not decide what to do.")

    def describe(self) -> str:
        return "scripted, claims a refund it never asked for"

    async def aclose(self) -> None:
        return None
