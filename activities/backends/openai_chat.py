"""OpenAI-compatible Chat Completions with tool calling, through the official `openai` SDK.

Works with OpenAI and with local servers that speak the protocol (vLLM, Ollama, llama.cpp's
server) by changing `OPENAI_BASE_URL`. The key and the base URL are read from the environment
here, in the worker, so they never enter a workflow or activity input.
"""

from __future__ import annotations

import json
import os
from typing import Any

import openai

from activities.backends._errors import ModelConfigError, connection_failure, status_failure, unusable
from core.models import ChatMessage, ModelReply, ModelTurnInput, ToolCall, ToolSchema
from infra.redact import redact

PROVIDER = "openai"
KEY_VARIABLE = "OPENAI_API_KEY"
BASE_URL_VARIABLE = "OPENAI_BASE_URL"


class OpenAIChatBackend:
    """One Chat Completions request per model turn; Temporal owns the retries (SDK retries off)."""

    def __init__(self, model: str, *, timeout_seconds: float, max_tokens: int | None = None) -> None:
        key = os.environ.get(KEY_VARIABLE, "")
        if not key:
            raise ModelConfigError(f"MODEL_BACKEND=openai needs {KEY_VARIABLE} (a local server that ignores "
                                   "keys still needs a placeholder, e.g. OPENAI_API_KEY=local)")
        self._model = model
        self._max_tokens = max_tokens
        self._secret = key
        self._client = openai.AsyncOpenAI(api_key=key, base_url=os.environ.get(BASE_URL_VARIABLE) or None,
                                          max_retries=0, timeout=timeout_seconds)

    def describe(self) -> str:
        return f"openai {self._model} at {redact(str(self._client.base_url))}"

    async def aclose(self) -> None:
        """Close the HTTP connections (at worker shutdown)."""
        await self._client.close()

    async def reply(self, turn: ModelTurnInput, schemas: list[ToolSchema]) -> ModelReply:
        request = chat_request(self._model, turn.messages, schemas, self._max_tokens)
        try:
            completion = await self._client.chat.completions.create(**request)
        except openai.APIStatusError as err:
            raise status_failure(PROVIDER, err, secret=self._secret, key_variable=KEY_VARIABLE) from None
        except openai.APIConnectionError as err:
            raise connection_failure(PROVIDER, str(self._client.base_url), err, secret=self._secret) from None
        return reply_from_completion(completion.model_dump(mode="json", exclude_unset=True, warnings=False),
                                     turn.turn)


def chat_request(model: str, messages: list[ChatMessage], schemas: list[ToolSchema],
                 max_tokens: int | None = None) -> dict[str, Any]:
    """The `chat.completions.create` arguments for our transcript window and tools."""
    request: dict[str, Any] = {"model": model, "messages": [_message(m) for m in messages]}
    if schemas:
        request["tools"] = [{"type": "function", "function": {"name": s.name, "description": s.description,
                                                              "parameters": s.parameters}} for s in schemas]
    if max_tokens is not None:
        request["max_completion_tokens"] = max_tokens
    return request


def _message(message: ChatMessage) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        return {"role": "assistant", "content": message.content or None,
                "tool_calls": [{"id": call.id, "type": "function",
                                "function": {"name": call.name, "arguments": call.arguments}}
                               for call in message.tool_calls]}
    return {"role": message.role, "content": message.content}


def reply_from_completion(completion: dict[str, Any], turn: int = 0) -> ModelReply:
    """Our reply from a chat completion body: its text, and its tool calls in order.

    Arguments stay the raw text the model wrote, valid JSON or not: the workflow's gate answers
    malformed ones (a server that sends them as an object gets them serialized). A call without
    an id (some local servers) gets one from the turn and its position.
    """
    choices = completion.get("choices") or []
    if not choices or not isinstance(choices[0].get("message"), dict):
        raise unusable(PROVIDER, f"no message in the completion (finish_reason "
                                 f"{choices[0].get('finish_reason') if choices else None})")
    message = choices[0]["message"]
    calls = []
    for index, raw in enumerate(message.get("tool_calls") or []):
        function = raw.get("function") or {}
        custom = raw.get("custom") or {}
        name = function.get("name") or custom.get("name") or ""
        arguments = function.get("arguments") if "function" in raw else custom.get("input")
        if isinstance(arguments, (dict, list)):
            arguments = json.dumps(arguments)
        calls.append(ToolCall(id=raw.get("id") or f"call_t{turn}_{index}", name=name,
                              arguments=arguments if isinstance(arguments, str) else "{}"))
    content = message.get("content") or message.get("refusal") or ""
    return ModelReply(content=content, tool_calls=calls)
