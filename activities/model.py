"""The model turn activity: provider-neutral messages and tool schemas in, a reply out."""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.scripted import ScriptedModel
from core.models import ModelReply, ModelTurnInput
from core.names import MODEL_TURN_ACTIVITY
from core.tools import REGISTRY


class ModelActivities:
    def __init__(self, backend: str) -> None:
        if backend != "scripted":
            raise ApplicationError(f"unknown MODEL_BACKEND {backend!r}", type="Configuration", non_retryable=True)
        self._backend = ScriptedModel()

    @activity.defn(name=MODEL_TURN_ACTIVITY)
    async def model_turn(self, turn: ModelTurnInput) -> ModelReply:
        schemas = [REGISTRY[name].schema() for name in turn.tools if name in REGISTRY]
        return self._backend.reply(turn, schemas)
