"""Anthropic Messages, as documented: `POST /v1/messages` with the key (`x-api-key`, or a bearer
`Authorization` as SDK 2 sends it) and `anthropic-version`.

The stub refuses what the API refuses (a wrong key, roles that do not alternate, a `tool_use`
not answered by a `tool_result` first in the next user message, a `tool_result` for no
`tool_use`, a non-object `input`, an empty text block) and otherwise replays the scripted
bodies, shaped as recorded from the API.
"""

from __future__ import annotations

import uuid
from typing import Any

from tests.stubs._server import Reply, StubServer

MODEL = "claude-sonnet-4-5-20250929"


class AnthropicStub(StubServer):
    route = "/v1/messages"

    def __init__(self, api_key: str) -> None:
        super().__init__()
        self.api_key = api_key

    def check(self, headers: dict[str, str], body: dict[str, Any]) -> Reply | None:
        if self.api_key not in (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer ")):
            return error(401, "authentication_error", "invalid x-api-key")
        if not headers.get("anthropic-version"):
            return error(400, "invalid_request_error", "anthropic-version: header is required")
        if not isinstance(body.get("model"), str) or not isinstance(body.get("max_tokens"), int):
            return error(400, "invalid_request_error", "model: Field required; max_tokens: Field required")
        for tool in body.get("tools", []):
            if not tool.get("name") or tool.get("input_schema", {}).get("type") != "object":
                return error(400, "invalid_request_error", f"tools: invalid tool {tool.get('name')!r}")
        problem = _check_messages(body.get("messages") or [])
        return None if problem is None else error(400, "invalid_request_error", problem)

    def error(self, status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
        return error(status, "invalid_request_error", message, headers)


def _check_messages(messages: list[dict[str, Any]]) -> str | None:
    if not messages or messages[0].get("role") != "user":
        return "messages: first message must use the \"user\" role"
    pending: list[str] = []
    for i, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        if i and messages[i - 1].get("role") == role:
            return f"messages.{i}: roles must alternate between \"user\" and \"assistant\""
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        if pending:
            leading = results[:len(pending)]
            if sorted(leading) != sorted(pending) or [b.get("type") for b in blocks[:len(pending)]] != \
                    ["tool_result"] * len(pending):
                return (f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately "
                        f"after: {', '.join(pending)}. Each `tool_use` block must have a corresponding "
                        "`tool_result` block in the next message.")
        elif results:
            return f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` blocks: {results[0]}"
        for block in blocks:
            if block.get("type") == "text" and not block.get("text"):
                return f"messages.{i}: text content blocks must be non-empty"
            if block.get("type") == "tool_use" and not isinstance(block.get("input"), dict):
                return f"messages.{i}: tool_use.input: Input should be a valid dictionary"
        pending = [b["id"] for b in blocks if b.get("type") == "tool_use"] if role == "assistant" else []
    return None


def tool_use(name: str, arguments: dict[str, Any] | str, call_id: str | None = None) -> dict[str, Any]:
    """A `tool_use` block; a str is put in `input` as is (what a broken reply would carry)."""
    return {"type": "tool_use", "id": call_id or f"toolu_{uuid.uuid4().hex[:24]}", "name": name,
            "input": arguments}


def message(*calls: dict[str, Any], content: str | None = None) -> Reply:
    """A message body: optional text, then the tool_use blocks in order."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
    blocks += calls
    return Reply({
        "id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": MODEL,
        "content": blocks, "stop_reason": "tool_use" if calls else "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 1204, "output_tokens": 87, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0, "service_tier": "standard"},
    })


def text(content: str) -> Reply:
    return message(content=content)


def error(status: int, type_: str, message: str, headers: dict[str, str] | None = None) -> Reply:
    request_id = f"req_{uuid.uuid4().hex[:24]}"
    return Reply({"type": "error", "error": {"type": type_, "message": message}, "request_id": request_id},
                 status, {"request-id": request_id, **(headers or {})})


def rate_limited(retry_after: str = "1") -> Reply:
    return error(429, "rate_limit_error", "This request would exceed the rate limit for your organization of "
                                          "50 requests per minute.", {"retry-after": retry_after})


def unauthorized() -> Reply:
    return error(401, "authentication_error", "invalid x-api-key")


def server_error() -> Reply:
    return error(500, "api_error", "Internal server error")
