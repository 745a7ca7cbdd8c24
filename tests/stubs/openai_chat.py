"""OpenAI Chat Completions, as documented: `POST /v1/chat/completions` with a bearer key.

The stub refuses what the API refuses (a wrong key, a tool message that answers no tool call, an
assistant tool call left unanswered) and otherwise replays the scripted bodies, shaped as
recorded from the API.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from tests.stubs._server import Reply, StubServer

MODEL = "gpt-4o-mini-2024-07-18"


class OpenAIStub(StubServer):
    route = "/v1/chat/completions"

    def __init__(self, api_key: str) -> None:
        super().__init__()
        self.api_key = api_key

    @property
    def base_url(self) -> str:
        """What OPENAI_BASE_URL is set to: the SDK appends `/chat/completions`."""
        return f"http://127.0.0.1:{self.port}/v1"

    def check(self, headers: dict[str, str], body: dict[str, Any]) -> Reply | None:
        if headers.get("authorization") != f"Bearer {self.api_key}":
            return error(401, "Incorrect API key provided. You can find your API key at "
                              "https://platform.openai.com/account/api-keys.", "invalid_request_error",
                         "invalid_api_key")
        if not isinstance(body.get("model"), str) or not body.get("messages"):
            return error(400, "'model' and 'messages' are required", "invalid_request_error")
        for tool in body.get("tools", []):
            function = tool.get("function") or {}
            if tool.get("type") != "function" or not function.get("name") or \
                    function.get("parameters", {}).get("type") != "object":
                return error(400, f"Invalid tool: {json.dumps(tool)[:200]}", "invalid_request_error")
        return _check_tool_messages(body["messages"])

    def error(self, status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
        return error(status, message, "invalid_request_error", headers=headers)


def _check_tool_messages(messages: list[dict[str, Any]]) -> Reply | None:
    open_calls: set[str] = set()
    for message in messages:
        role = message.get("role")
        if role == "tool":
            if message.get("tool_call_id") not in open_calls:
                return error(400, "Invalid parameter: messages with role 'tool' must be a response to a "
                                  "preceeding message with 'tool_calls'.", "invalid_request_error")
            open_calls.discard(message["tool_call_id"])
            continue
        if open_calls:
            return error(400, "An assistant message with 'tool_calls' must be followed by tool messages "
                              "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                              f"response messages: {', '.join(sorted(open_calls))}", "invalid_request_error")
        if role == "assistant":
            open_calls = {call["id"] for call in message.get("tool_calls") or []}
    return None


def tool_call(name: str, arguments: dict[str, Any] | str, call_id: str | None = None) -> dict[str, Any]:
    """One entry of `message.tool_calls`; a str is sent as the raw arguments text, valid JSON or not."""
    return {"id": call_id or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": arguments if isinstance(arguments, str)
                         else json.dumps(arguments)}}


def completion(*calls: dict[str, Any], content: str | None = None) -> Reply:
    """A chat.completion body: the assistant's text, or its tool calls in order."""
    message = {"role": "assistant", "content": content, "refusal": None, "annotations": []}
    if calls:
        message["tool_calls"] = list(calls)
    return Reply({
        "id": f"chatcmpl-{uuid.uuid4().hex[:29]}", "object": "chat.completion", "created": 1767225600,
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": {"prompt_tokens": 812, "completion_tokens": 41, "total_tokens": 853,
                  "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                  "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                                "accepted_prediction_tokens": 0,
                                                "rejected_prediction_tokens": 0}},
        "service_tier": "default", "system_fingerprint": "fp_560af6e559",
    })


def text(content: str) -> Reply:
    return completion(content=content)


def error(status: int, message: str, type_: str, code: str | None = None,
          headers: dict[str, str] | None = None) -> Reply:
    return Reply({"error": {"message": message, "type": type_, "param": None, "code": code}}, status,
                 {"x-request-id": f"req_{uuid.uuid4().hex}", **(headers or {})})


def rate_limited(retry_after: str = "1") -> Reply:
    return error(429, f"Rate limit reached for gpt-4o-mini in organization org-stub on requests per min (RPM): "
                      f"Limit 500, Used 500, Requested 1. Please try again in {retry_after}s.", "requests",
                 "rate_limit_exceeded", {"retry-after": retry_after})


def unauthorized() -> Reply:
    return error(401, "Incorrect API key provided: sk-revo*********************7Qx2. You can find your API key "
                      "at https://platform.openai.com/account/api-keys.", "invalid_request_error",
                 "invalid_api_key")


def server_error() -> Reply:
    return error(500, "The server had an error while processing your request. Sorry about that!", "server_error")
