"""Protocol stubs that play the agent: each request is answered by the scripted model reading the
conversation the request carries, so a whole ticket runs through the real `openai` / `anthropic`
SDK and backend without a queue of canned replies (the eval's real-backend columns in tests).

What reaches the scripted model is only what the provider would see: the messages of the request,
translated back from the protocol. The task kind is read from the ticket text, as a model would.
"""

from __future__ import annotations

import json
from typing import Any

from activities.scripted import ScriptedModel
from core.models import ChatMessage, ModelReply, ModelTurnInput, ToolCall
from tests.stubs import anthropic_messages as anthropic_stub
from tests.stubs import openai_chat as openai_stub
from tests.stubs._server import Reply

__all__ = ["PlayingAnthropicStub", "PlayingOpenAIStub"]


def _scenario(brief: str) -> str:
    if "INV-" in brief:
        return "INV-9"
    return "SU-88421" if "SU-" in brief else "refund-8841"


def _play(messages: list[ChatMessage]) -> ModelReply:
    brief = next((m.content for m in messages if m.role == "user" and m.content), "")
    turn = 1 + sum(1 for m in messages if m.role == "assistant")
    return ScriptedModel().reply(ModelTurnInput(task_id="stub", scenario=_scenario(brief), turn=turn,
                                                messages=messages, tools=[]))


class PlayingOpenAIStub(openai_stub.OpenAIStub):
    def check(self, headers: dict[str, str], body: dict[str, Any]) -> Reply | None:
        """A refusal where the API would refuse; otherwise the scripted model's answer to the request."""
        problem = super().check(headers, body)
        if problem is not None:
            return problem
        messages = []
        for m in body["messages"]:
            calls = [ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
                     for c in m.get("tool_calls") or []]
            messages.append(ChatMessage(role=m["role"], content=m.get("content") or "", tool_calls=calls,
                                        tool_call_id=m.get("tool_call_id")))
        reply = _play(messages)
        if reply.tool_calls:
            return openai_stub.completion(*(openai_stub.tool_call(c.name, c.arguments, c.id) for c in reply.tool_calls))
        return openai_stub.text(reply.content)


class PlayingAnthropicStub(anthropic_stub.AnthropicStub):
    def check(self, headers: dict[str, str], body: dict[str, Any]) -> Reply | None:
        """A refusal where the API would refuse; otherwise the scripted model's answer to the request."""
        problem = super().check(headers, body)
        if problem is not None:
            return problem
        messages = []
        for m in body["messages"]:
            content = m["content"]
            if isinstance(content, str):
                messages.append(ChatMessage(role=m["role"], content=content))
                continue
            text = "".join(b.get("text", "") for b in content if b.get("type") == "text")
            calls = [ToolCall(id=b["id"], name=b["name"], arguments=json.dumps(b["input"]))
                     for b in content if b.get("type") == "tool_use"]
            if m["role"] == "assistant":
                messages.append(ChatMessage(role="assistant", content=text, tool_calls=calls))
                continue
            for block in content:
                if block.get("type") == "tool_result":
                    result = block.get("content")
                    if isinstance(result, list):
                        result = "".join(b.get("text", "") for b in result)
                    messages.append(ChatMessage(role="tool", tool_call_id=block["tool_use_id"], content=result))
            if text:
                messages.append(ChatMessage(role="user", content=text))
        reply = _play(messages)
        if reply.tool_calls:
            return anthropic_stub.message(*(anthropic_stub.tool_use(c.name, json.loads(c.arguments), c.id)
                                            for c in reply.tool_calls))
        return anthropic_stub.text(reply.content)
