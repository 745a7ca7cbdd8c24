"""Anthropic Messages with tool use, through the official `anthropic` SDK.

The key and the base URL are read from the environment here, in the worker, so they never
enter a workflow or activity input.
"""

from __future__ import annotations

import json
import os
from typing import Any

import anthropic

from activities.backends._errors import ModelConfigError, connection_failure, status_failure, unusable
from core.models import ChatMessage, ModelReply, ModelTurnInput, ToolCall, ToolSchema
from infra.redact import redact

PROVIDER = "anthropic"
KEY_VARIABLE = "ANTHROPIC_API_KEY"
BASE_URL_VARIABLE = "ANTHROPIC_BASE_URL"
RAW_ARGUMENTS = "_raw_arguments"
"""Where a tool call whose arguments were not a JSON object is kept when it is sent back."""


class AnthropicMessagesBackend:
    """One Messages request per model turn; Temporal owns the retries (SDK retries off)."""

    def __init__(self, model: str, *, timeout_seconds: float, max_tokens: int) -> None:
        key = os.environ.get(KEY_VARIABLE, "")
        if not key:
            raise ModelConfigError(f"MODEL_BACKEND=anthropic needs {KEY_VARIABLE}")
        self._model = model
        self._max_tokens = max_tokens
        self._secret = key
        self._client = anthropic.AsyncAnthropic(api_key=key, base_url=os.environ.get(BASE_URL_VARIABLE) or None,
                                                max_retries=0, timeout=timeout_seconds)

    def describe(self) -> str:
        return f"anthropic {self._model} at {redact(str(self._client.base_url))}"

    async def aclose(self) -> None:
        """Close the HTTP connections (at worker shutdown)."""
        await self._client.close()

    async def reply(self, turn: ModelTurnInput, schemas: list[ToolSchema]) -> ModelReply:
        request = messages_request(self._model, turn.messages, schemas, self._max_tokens)
        try:
            message = await self._client.messages.create(**request)
        except anthropic.APIStatusError as err:
            raise status_failure(PROVIDER, err, secret=self._secret, key_variable=KEY_VARIABLE) from None
        except anthropic.APIConnectionError as err:
            raise connection_failure(PROVIDER, str(self._client.base_url), err, secret=self._secret) from None
        return reply_from_message(message.model_dump(mode="json", exclude_unset=True, warnings=False))


def messages_request(model: str, messages: list[ChatMessage], schemas: list[ToolSchema],
                     max_tokens: int) -> dict[str, Any]:
    """The `messages.create` arguments for our transcript window and tools.

    System messages become the `system` parameter; an assistant turn's tool calls become
    `tool_use` blocks; tool results become `tool_result` blocks of one user message, first in it,
    so consecutive results (and any user text after them) share that message, as the API requires
    strictly alternating roles.
    """
    system = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    request: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": turns}
    if system:
        request["system"] = system
    if schemas:
        request["tools"] = [{"name": s.name, "description": s.description, "input_schema": s.parameters}
                            for s in schemas]
    return request


def _blocks(message: ChatMessage) -> list[dict[str, Any]]:
    if message.role == "tool":
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id or "",
                                 "content": message.content}
        if _failed(message.content):
            block["is_error"] = True
        return [block]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": message.content}] if message.content else []
    if message.role == "assistant":
        blocks += [{"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call.arguments)}
                   for call in message.tool_calls]
    return blocks


def _input(arguments: str) -> dict[str, Any]:
    """The API takes an object; what the model sent that was not one is kept as its raw text."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {RAW_ARGUMENTS: arguments}
    return value if isinstance(value, dict) else {RAW_ARGUMENTS: arguments}


def _failed(content: str) -> bool:
    """A result that reports nothing was done (or may not have been): `is_error` for the model."""
    try:
        result = json.loads(content)
    except ValueError:
        return False
    if not isinstance(result, dict):
        return False
    return result.get("outcome") in ("not_performed", "unknown") or (
        result.get("outcome") is None and bool(result.get("reason")))


def reply_from_message(message: dict[str, Any]) -> ModelReply:
    """Our reply from a Messages body: its text blocks joined, its `tool_use` blocks in order.

    `tool_use.input` is an object and is serialized to JSON text; anything else is passed on as
    text, for the workflow's gate to answer as malformed.
    """
    content = message.get("content")
    if not isinstance(content, list):
        raise unusable(PROVIDER, f"no content blocks (stop_reason {message.get('stop_reason')})")
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in content:
        if block.get("type") == "text" and block.get("text"):
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            raw = block.get("input")
            arguments = raw if isinstance(raw, str) else json.dumps(raw if raw is not None else {})
            calls.append(ToolCall(id=block.get("id") or f"toolu_{len(calls)}", name=block.get("name") or "",
                                  arguments=arguments))
    return ModelReply(content="\n\n".join(texts), tool_calls=calls)
