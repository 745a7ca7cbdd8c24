"""The model turn activity: provider-neutral messages and tool schemas in, a reply out.

The backend is chosen once per worker (`make_backend`, from MODEL_BACKEND and MODEL_NAME); the
activity is the same `model_turn` whichever answers. What history records is our `ModelReply`,
so a replay never calls a model. Real backends read their keys from the environment themselves.
"""

from __future__ import annotations

import functools
from typing import Protocol

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.backends import UNAVAILABLE, ModelConfigError
from activities.scripted import ScriptedModel
from core.bounds import bounded_reply
from core.models import ChatMessage, ModelReply, ModelTurnInput, ToolSchema
from core.names import MODEL_TURN_ACTIVITY
from core.tools import REGISTRY
from infra.redact import redact

BACKENDS = ("scripted", "openai", "anthropic")

__all__ = ["BACKENDS", "ModelActivities", "ModelBackend", "ModelConfigError", "ScriptedBackend", "make_backend"]


class ModelBackend(Protocol):
    """What answers a model turn. Raise `ApplicationError` for failures (see backends/_errors.py)."""

    async def reply(self, turn: ModelTurnInput, schemas: list[ToolSchema]) -> ModelReply: ...

    def describe(self) -> str: ...

    async def aclose(self) -> None: ...


class ScriptedBackend:
    """The deterministic model that plays the scenarios, behind the async interface."""

    def __init__(self) -> None:
        self._model = ScriptedModel()

    async def reply(self, turn: ModelTurnInput, schemas: list[ToolSchema]) -> ModelReply:
        return self._model.reply(turn, schemas)

    def describe(self) -> str:
        return "scripted"

    async def aclose(self) -> None:
        return None


def make_backend(name: str, model_name: str | None = None, *, timeout_seconds: float = 100.0,
                 max_tokens: int = 4096) -> ModelBackend:
    """The backend MODEL_BACKEND names; `ModelConfigError` if it cannot start.

    Args:
        name: `scripted`, `openai` (OpenAI-compatible Chat Completions) or `anthropic` (Messages).
        model_name: the provider's model id (MODEL_NAME); required by the real backends.
        timeout_seconds: the HTTP timeout of one request, below the activity's start-to-close.
        max_tokens: the reply's token limit (Anthropic requires one; OpenAI is sent none).
    """
    if name == "scripted":
        return ScriptedBackend()
    if name not in BACKENDS:
        raise ModelConfigError(f"unknown MODEL_BACKEND {name!r}; choose one of {', '.join(BACKENDS)}")
    if not model_name:
        raise ModelConfigError(f"MODEL_BACKEND={name} needs MODEL_NAME (the provider's model id)")
    if name == "openai":
        from activities.backends.openai_chat import OpenAIChatBackend
        return OpenAIChatBackend(model_name, timeout_seconds=timeout_seconds)
    from activities.backends.anthropic_messages import AnthropicMessagesBackend
    return AnthropicMessagesBackend(model_name, timeout_seconds=timeout_seconds, max_tokens=max_tokens)


SYSTEM_PROMPT = (
    "You are an operations agent. Use the tools. Every write tool answers performed, "
    "already_performed, not_performed (nothing changed; you may retry) or unknown "
    "(do not retry; a human decides). Never promise what a tool did not report as performed."
)
_SYSTEM = ChatMessage(role="system", content=SYSTEM_PROMPT)


class ModelActivities:
    def __init__(self, backend: ModelBackend) -> None:
        self._backend = backend

    @activity.defn(name=MODEL_TURN_ACTIVITY)
    async def model_turn(self, turn: ModelTurnInput) -> ModelReply:
        """One model turn; the heartbeat pump (activities/heartbeats.py) beats while the provider thinks."""
        schemas = [_schema(name) for name in turn.tools if name in REGISTRY]
        if not turn.messages or turn.messages[0].role != "system":  # tasks before this worker sent it themselves
            turn = turn.model_copy(update={"messages": [_SYSTEM, *turn.messages]})
        try:
            return bounded_reply(await self._backend.reply(turn, schemas))
        except ApplicationError:
            raise
        except Exception as err:  # an unexpected error may quote a base URL with its password
            raise ApplicationError(redact(f"{type(err).__name__}: {err}")[:500], type=UNAVAILABLE) from None


@functools.cache
def _schema(name: str) -> ToolSchema:
    """A tool's JSON schema, generated once per worker: it is a pure function of the argument model."""
    return REGISTRY[name].schema()
