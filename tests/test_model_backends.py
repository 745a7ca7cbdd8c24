"""The real model backends, end to end: the official `openai` and `anthropic` SDKs talk HTTP to a
stub of each protocol on 127.0.0.1 while a workflow runs on the dev server against localstripe.

Judged on the requests the provider received (tool schemas from the argument models, tool
results in each protocol's format, carrying the outcome), on the provider's refunds, and on the
event history (retries owned by Temporal, keys never recorded).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import timedelta
from email.utils import formatdate
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import RetryState
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ApplicationError

import worker
from activities.backends import RATE_LIMITED, REJECTED, UNAVAILABLE, UNUSABLE
from activities.backends._errors import retry_after, status_failure
from activities.backends.anthropic_messages import RAW_ARGUMENTS, messages_request, reply_from_message
from activities.backends.openai_chat import reply_from_completion
from activities.model import SYSTEM_PROMPT, ModelBackend, make_backend
from activities.world import World
from core.kinds import KINDS, TaskKind
from core.models import ChatMessage, ModelTurnInput, Outcome, ToolCall
from core.names import MODEL_TURN_ACTIVITY
from core.policies import TOOL_HEARTBEAT as HEARTBEAT_TIMEOUT
from core.tools import REGISTRY
from infra.settings import PROJECT_ROOT, Settings
from tests.helpers import finished, running_worker, scenario_task, start
from tests.stubs import AnthropicStub, OpenAIStub, Reply, Request, StubServer
from tests.stubs import anthropic_messages as anthropic_stub
from tests.stubs import openai_chat as openai_stub

REFUND = {"order_id": "SU-88421", "item_id": "oak-shelf-4", "amount_cents": 11800, "currency": "usd",
          "reason": "arrived damaged"}

Call = tuple[str, dict[str, Any] | str, str]
"""A tool call to script: name, arguments (a str is sent as raw text), a short id."""


@dataclass
class _Protocol:
    """One protocol's stub, the settings that select its backend, and how to read its requests."""

    stub: StubServer
    settings: Settings
    api_key: str

    name: ClassVar[str]
    model_name: ClassVar[str]
    key_variable: ClassVar[str]
    base_url_variable: ClassVar[str]
    stub_class: ClassVar[type[StubServer]]
    rate_limited: ClassVar[Callable[[str], Reply]]
    unauthorized: ClassVar[Callable[[], Reply]]
    server_error: ClassVar[Callable[[], Reply]]

    def call_id(self, short: str) -> str:
        raise NotImplementedError

    def calls(self, *calls: Call) -> Reply:
        raise NotImplementedError

    def text(self, content: str) -> Reply:
        raise NotImplementedError

    def tools(self, request: Request) -> dict[str, dict[str, Any]]:
        """Tool name -> its JSON schema, as the request declared them."""
        raise NotImplementedError

    def results(self, request: Request) -> list[tuple[str, dict[str, Any]]]:
        """The tool results the request carries after the model's last turn: (call id, result)."""
        raise NotImplementedError

    @property
    def requests(self) -> list[Request]:
        return self.stub.requests


class _OpenAI(_Protocol):
    name = "openai"
    model_name = "stub-chat-model"
    key_variable = "OPENAI_API_KEY"
    base_url_variable = "OPENAI_BASE_URL"
    stub_class = OpenAIStub
    rate_limited = staticmethod(openai_stub.rate_limited)
    unauthorized = staticmethod(openai_stub.unauthorized)
    server_error = staticmethod(openai_stub.server_error)

    def call_id(self, short: str) -> str:
        return f"call_{short}"

    def calls(self, *calls: Call) -> Reply:
        return openai_stub.completion(*(openai_stub.tool_call(n, a, self.call_id(i)) for n, a, i in calls))

    def text(self, content: str) -> Reply:
        return openai_stub.text(content)

    def tools(self, request: Request) -> dict[str, dict[str, Any]]:
        assert all(t["type"] == "function" for t in request.body["tools"])
        return {t["function"]["name"]: t["function"]["parameters"] for t in request.body["tools"]}

    def results(self, request: Request) -> list[tuple[str, dict[str, Any]]]:
        messages = request.body["messages"]
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        assert all(m["role"] == "tool" for m in messages[last + 1:])
        return [(m["tool_call_id"], json.loads(m["content"])) for m in messages[last + 1:]]


class _Anthropic(_Protocol):
    name = "anthropic"
    model_name = "stub-messages-model"
    key_variable = "ANTHROPIC_API_KEY"
    base_url_variable = "ANTHROPIC_BASE_URL"
    stub_class = AnthropicStub
    rate_limited = staticmethod(anthropic_stub.rate_limited)
    unauthorized = staticmethod(anthropic_stub.unauthorized)
    server_error = staticmethod(anthropic_stub.server_error)

    def call_id(self, short: str) -> str:
        return f"toolu_{short}"

    def calls(self, *calls: Call) -> Reply:
        return anthropic_stub.message(*(anthropic_stub.tool_use(n, a, self.call_id(i)) for n, a, i in calls))

    def text(self, content: str) -> Reply:
        return anthropic_stub.text(content)

    def tools(self, request: Request) -> dict[str, dict[str, Any]]:
        return {t["name"]: t["input_schema"] for t in request.body["tools"]}

    def results(self, request: Request) -> list[tuple[str, dict[str, Any]]]:
        last = request.body["messages"][-1]
        assert last["role"] == "user"
        return [(b["tool_use_id"], json.loads(b["content"])) for b in last["content"] if b["type"] == "tool_result"]


PROTOCOLS = {"openai": _OpenAI, "anthropic": _Anthropic}


@pytest_asyncio.fixture(params=sorted(PROTOCOLS))
async def model(request: pytest.FixtureRequest, settings: Settings, monkeypatch: pytest.MonkeyPatch
                ) -> AsyncIterator[_Protocol]:
    """A stub provider, its key and base URL in the environment, settings that select its backend."""
    protocol = PROTOCOLS[request.param]
    api_key = f"sk-test-{uuid.uuid4().hex}"
    built: list[ModelBackend] = []

    def tracked(*args: Any, **kwargs: Any) -> ModelBackend:
        """The real factory; the fixture closes what it built, as worker.py does at shutdown."""
        built.append(make_backend(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(worker, "make_backend", tracked)
    async with protocol.stub_class(api_key) as stub:
        monkeypatch.setenv(protocol.key_variable, api_key)
        monkeypatch.setenv(protocol.base_url_variable, stub.base_url)
        chosen = settings.model_copy(update={"model_backend": protocol.name, "model_name": protocol.model_name})
        yield protocol(stub, chosen, api_key)
        for backend in built:
            await backend.aclose()


async def _model_events(handle: WorkflowHandle) -> tuple[list[Any], list[Any]]:
    """The model_turn activities' started and failed event attributes, in history order."""
    history = await handle.fetch_history()
    scheduled = {e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
                 for e in history.events if e.HasField("activity_task_scheduled_event_attributes")}
    started = [e.activity_task_started_event_attributes for e in history.events
               if e.HasField("activity_task_started_event_attributes")
               and scheduled[e.activity_task_started_event_attributes.scheduled_event_id] == MODEL_TURN_ACTIVITY]
    failed = [e.activity_task_failed_event_attributes for e in history.events
              if e.HasField("activity_task_failed_event_attributes")
              and scheduled[e.activity_task_failed_event_attributes.scheduled_event_id] == MODEL_TURN_ACTIVITY]
    return started, failed


async def _history_holds(handle: WorkflowHandle, secret: str) -> bool:
    history = await handle.fetch_history()
    return any(secret.encode() in event.SerializeToString() for event in history.events)


# --- end to end --------------------------------------------------------------------------------


async def test_refund_asked_three_times_pays_once(client: Client, model: _Protocol, world: World):
    model.stub.queue(
        model.calls(("get_order", {"order_id": "SU-88421"}, "lookup"),
                    ("search_policy", {"query": "damaged item refund"}, "policy")),
        model.calls(("issue_refund", REFUND, "refund1")),
        model.calls(("issue_refund", REFUND, "refund2")),
        model.calls(("issue_refund", REFUND, "refund3")),
        model.text("Refunded 118.00 USD to the buyer."),
    )
    task = scenario_task("SU-88421")
    async with running_worker(client, model.settings):
        handle = await start(client, model.settings, task)
        result = await finished(handle)

    assert result.state == "completed" and result.final_answer == "Refunded 118.00 USD to the buyer."
    refunds = world.refunds("SU-88421")
    assert [r["amount_cents"] for r in refunds] == [11800], "three asks, one refund at the provider"
    assert refunds[0]["intent_key"] == result.checkpoint.steps["issue_refund"].intent_key

    first, *rest = model.requests
    assert len(rest) == 4 and all(r.status == 200 for r in model.requests)
    assert all(r.body["model"] == model.model_name for r in model.requests)
    tools = model.tools(first)
    assert sorted(tools) == sorted(KINDS[TaskKind.REFUND_TICKET].tools), "only the ticket's own tools"
    assert all(tools[name] == REGISTRY[name].args.model_json_schema() for name in tools)

    lookup, policy = model.results(rest[0])
    assert [lookup[0], policy[0]] == [model.call_id("lookup"), model.call_id("policy")], "several calls, in order"
    assert lookup[1]["data"]["order_id"] == "SU-88421" and "outcome" not in lookup[1]
    outcomes = [model.results(r) for r in rest[1:]]
    assert [[(i, r["outcome"]) for i, r in results] for results in outcomes] == [
        [(model.call_id("refund1"), "performed")],
        [(model.call_id("refund2"), "already_performed")],
        [(model.call_id("refund3"), "already_performed")],
    ]
    assert {r["intent_key"] for results in outcomes for _, r in results} == {refunds[0]["intent_key"]}

    step = result.checkpoint.steps["issue_refund"]
    assert step.outcome is Outcome.ALREADY_PERFORMED and len(step.trail) == 3 and step.attempts == 1
    assert not await _history_holds(handle, model.api_key), "the API key must never reach the history"


@pytest.mark.parametrize("model", ["openai"], indirect=True)
async def test_openai_messages_carry_tool_calls_and_tool_roles(client: Client, model: _Protocol, world: World):
    model.stub.queue(model.calls(("get_order", {"order_id": "SU-88421"}, "a"),
                                 ("search_policy", {"query": "damage"}, "b")),
                     model.text("Checked."))
    task = scenario_task("SU-88421")
    async with running_worker(client, model.settings):
        assert (await finished(await start(client, model.settings, task))).state == "completed"
    messages = model.requests[1].body["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool"]
    assert messages[0]["content"] == SYSTEM_PROMPT and messages[1]["content"] == task.brief
    assert messages[2]["content"] is None
    assert messages[2]["tool_calls"] == [
        {"id": "call_a", "type": "function",
         "function": {"name": "get_order", "arguments": '{"order_id": "SU-88421"}'}},
        {"id": "call_b", "type": "function",
         "function": {"name": "search_policy", "arguments": '{"query": "damage"}'}},
    ]
    assert [m["tool_call_id"] for m in messages[3:]] == ["call_a", "call_b"]
    assert model.requests[1].headers["authorization"] == f"Bearer {model.api_key}"


@pytest.mark.parametrize("model", ["anthropic"], indirect=True)
async def test_anthropic_messages_carry_system_tool_use_and_merged_results(client: Client, model: _Protocol,
                                                                           world: World):
    model.stub.queue(anthropic_stub.message(anthropic_stub.tool_use("get_order", {"order_id": "SU-88421"}, "toolu_a"),
                                            anthropic_stub.tool_use("search_policy", {"query": "damage"}, "toolu_b"),
                                            content="Let me look."),
                     model.text("Checked."))
    task = scenario_task("SU-88421")
    async with running_worker(client, model.settings):
        assert (await finished(await start(client, model.settings, task))).state == "completed"
    body = model.requests[1].body
    assert body["system"] == SYSTEM_PROMPT and body["max_tokens"] == model.settings.model_max_tokens
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][0]["content"] == [{"type": "text", "text": task.brief}]
    assert body["messages"][1]["content"] == [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_a", "name": "get_order", "input": {"order_id": "SU-88421"}},
        {"type": "tool_use", "id": "toolu_b", "name": "search_policy", "input": {"query": "damage"}},
    ]
    results = body["messages"][2]["content"]
    assert [(b["type"], b["tool_use_id"]) for b in results] == [("tool_result", "toolu_a"), ("tool_result", "toolu_b")]
    assert all(isinstance(b["content"], str) and "is_error" not in b for b in results)
    assert model.requests[1].headers["anthropic-version"]


async def test_rate_limit_and_server_error_are_retried_by_temporal(client: Client, model: _Protocol, world: World):
    model.stub.queue(model.server_error(), model.rate_limited("1"), model.text("Nothing to do."))
    async with running_worker(client, model.settings):
        handle = await start(client, model.settings, scenario_task("SU-88421"))
        result = await finished(handle)
    assert result.state == "completed" and result.final_answer == "Nothing to do."
    assert [r.status for r in model.requests] == [500, 429, 200]
    assert all(r.headers["x-stainless-retry-count"] == "0" for r in model.requests), "SDK retries are off"
    assert model.requests[2].received_at - model.requests[1].received_at >= 0.9
    started, failed = await _model_events(handle)
    assert failed == [] and [s.attempt for s in started] == [3], "one activity, retried by Temporal"
    last = started[0].last_failure
    assert last.application_failure_info.type == RATE_LIMITED and not last.application_failure_info.non_retryable
    assert last.application_failure_info.next_retry_delay.ToTimedelta() == timedelta(seconds=1)
    assert "429" in last.message


@pytest.mark.parametrize("model", ["openai"], indirect=True)
async def test_a_slow_model_heartbeats_through_its_call(client: Client, model: _Protocol, world: World):
    """A reply slower than the heartbeat timeout (3 s): the worker heartbeats while the SDK waits."""
    model.stub.queue(model.text("Thought about it.").slow(HEARTBEAT_TIMEOUT.total_seconds() + 0.5))
    async with running_worker(client, model.settings):
        handle = await start(client, model.settings, scenario_task("SU-88421"))
        assert (await finished(handle)).state == "completed"
    started, failed = await _model_events(handle)
    assert failed == [] and [s.attempt for s in started] == [1] and len(model.requests) == 1


async def test_rejected_key_ends_the_task_without_retries(client: Client, model: _Protocol, world: World):
    model.stub.queue(model.unauthorized())
    async with running_worker(client, model.settings):
        handle = await start(client, model.settings, scenario_task("SU-88421"))
        result = await finished(handle)
    assert result.state == "dead_lettered"
    assert "(401)" in result.final_answer and model.key_variable in result.final_answer
    assert len(model.requests) == 1, "neither the SDK nor Temporal retried a rejected key"
    started, failed = await _model_events(handle)
    assert [s.attempt for s in started] == [1] and len(failed) == 1
    assert failed[0].failure.application_failure_info.type == REJECTED
    assert failed[0].failure.application_failure_info.non_retryable
    assert failed[0].retry_state == RetryState.RETRY_STATE_NON_RETRYABLE_FAILURE
    assert world.refunds("SU-88421") == []


async def test_malformed_arguments_come_back_not_performed(client: Client, model: _Protocol, world: World):
    truncated = '{"order_id": "SU-88421", "item_id": "oak-shelf-4", "amount_cents": 118'
    model.stub.queue(
        model.calls(("issue_refund", truncated, "broken"),
                    ("issue_refund", {**REFUND, "amount_cents": "118.00"}, "typed")),
        model.calls(("issue_refund", REFUND, "fixed")),
        model.text("Refunded."),
    )
    async with running_worker(client, model.settings):
        result = await finished(await start(client, model.settings, scenario_task("SU-88421")))
    assert result.state == "completed"
    (broken_id, broken), (typed_id, typed) = model.results(model.requests[1])
    assert (broken_id, broken["outcome"], broken["reason"], broken["retryable"]) == \
        (model.call_id("broken"), "not_performed", "malformed_arguments", True)
    assert (typed_id, typed["outcome"], typed["reason"]) == \
        (model.call_id("typed"), "not_performed", "invalid_arguments")
    assert json.loads(typed["message"])[0]["field"] == "amount_cents"
    [(_, fixed)] = model.results(model.requests[2])
    assert fixed["outcome"] == "performed"
    assert [r["amount_cents"] for r in world.refunds("SU-88421")] == [11800]

    echoed = json.dumps(model.requests[1].body["messages"])
    if model.name == "openai":
        assert json.dumps(truncated) in echoed, "the model's own broken arguments, sent back as it wrote them"
    else:
        assert json.dumps({RAW_ARGUMENTS: truncated}) in echoed, "Anthropic takes an object: the text is wrapped"
        last = model.requests[1].body["messages"][-1]["content"]
        assert [b.get("is_error") for b in last] == [True, True]


# --- at worker start ---------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "line"), [
    ({"MODEL_BACKEND": "openai", "MODEL_NAME": "gpt-4o-mini"}, "worker: MODEL_BACKEND=openai needs OPENAI_API_KEY"),
    ({"MODEL_BACKEND": "anthropic", "MODEL_NAME": "claude-sonnet-4-5"},
     "worker: MODEL_BACKEND=anthropic needs ANTHROPIC_API_KEY"),
    ({"MODEL_BACKEND": "openai", "OPENAI_API_KEY": "sk-x"}, "worker: MODEL_BACKEND=openai needs MODEL_NAME"),
    ({"MODEL_BACKEND": "gemini"}, "configuration error: MODEL_BACKEND: Input should be 'scripted', 'openai' or"),
])
def test_worker_refuses_to_start_on_a_model_misconfiguration(env: dict[str, str], line: str):
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("OPENAI_", "ANTHROPIC_", "MODEL_", "TEMPORAL_", "STRIPE_"))}
    done = subprocess.run([sys.executable, "worker.py"], cwd=PROJECT_ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith(line), done.stderr


# --- conversions and error classes, no server --------------------------------------------------


def test_anthropic_request_merges_results_and_wraps_unparsable_arguments():
    transcript = [
        ChatMessage(role="system", content="be careful"),
        ChatMessage(role="user", content="ticket"),
        ChatMessage(role="assistant", content="", tool_calls=[
            ToolCall(id="t1", name="get_order", arguments='{"order_id": "A"}'),
            ToolCall(id="t2", name="issue_refund", arguments="not json"),
            ToolCall(id="t3", name="issue_refund", arguments="[1, 2]")]),
        ChatMessage(role="tool", tool_call_id="t1", content='{"tool": "get_order", "data": {"order_id": "A"}}'),
        ChatMessage(role="tool", tool_call_id="t2", content='{"tool": "issue_refund", "outcome": "not_performed", '
                                                            '"reason": "malformed_arguments"}'),
        ChatMessage(role="tool", tool_call_id="t3", content='{"tool": "issue_refund", "outcome": "already_performed"}'),
    ]
    request = messages_request("m", transcript, [REGISTRY["get_order"].schema()], 512)
    assert request["system"] == "be careful" and request["max_tokens"] == 512
    assert request["tools"] == [{"name": "get_order", "description": REGISTRY["get_order"].description,
                                 "input_schema": REGISTRY["get_order"].args.model_json_schema()}]
    user, assistant, results = request["messages"]
    assert user == {"role": "user", "content": [{"type": "text", "text": "ticket"}]}
    assert [b["input"] for b in assistant["content"]] == [
        {"order_id": "A"}, {RAW_ARGUMENTS: "not json"}, {RAW_ARGUMENTS: "[1, 2]"}]
    assert results["role"] == "user"
    assert [(b["tool_use_id"], b.get("is_error", False)) for b in results["content"]] == [
        ("t1", False), ("t2", True), ("t3", False)]


def test_replies_keep_raw_arguments_and_order():
    anthropic_reply = reply_from_message({"content": [
        {"type": "text", "text": "Two things."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_order", "input": {"order_id": "A", "n": 1}},
        {"type": "tool_use", "id": "toolu_2", "name": "issue_refund", "input": '{"broken'},
    ]})
    assert anthropic_reply.content == "Two things."
    assert [(c.id, c.arguments) for c in anthropic_reply.tool_calls] == [
        ("toolu_1", '{"order_id": "A", "n": 1}'), ("toolu_2", '{"broken')]
    openai_reply = reply_from_completion({"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_order", "arguments": '{"order_id": '}},
        {"type": "function", "function": {"name": "search_policy", "arguments": {"query": "q"}}},
    ]}}]}, turn=7)
    assert openai_reply.content == ""
    assert [(c.id, c.name, c.arguments) for c in openai_reply.tool_calls] == [
        ("call_1", "get_order", '{"order_id": '), ("call_t7_1", "search_policy", '{"query": "q"}')]


def test_retry_after_headers():
    assert retry_after({"retry-after": "1"}) == timedelta(seconds=1)
    assert retry_after({"retry-after": "2.5"}) == timedelta(seconds=2.5)
    assert retry_after({"retry-after-ms": "250", "retry-after": "9"}) == timedelta(milliseconds=250)
    in_30s = formatdate(time.time() + 30, usegmt=True)
    assert timedelta(seconds=25) < retry_after({"retry-after": in_30s}) <= timedelta(seconds=30)
    assert retry_after({"retry-after": "86400"}) == timedelta(minutes=10)
    for value in ("0", "-3", "soon", "nan", ""):
        assert retry_after({"retry-after": value}) is None
    assert retry_after(None) is None


@pytest.mark.parametrize(("status", "kind", "retryable"), [
    (400, REJECTED, False), (401, REJECTED, False), (403, REJECTED, False), (404, REJECTED, False),
    (422, REJECTED, False), (408, UNAVAILABLE, True), (409, UNAVAILABLE, True), (429, RATE_LIMITED, True),
    (500, UNAVAILABLE, True), (503, UNAVAILABLE, True), (529, UNAVAILABLE, True),
])
def test_status_classes(status: int, kind: str, retryable: bool):
    answer = SimpleNamespace(status_code=status, response=SimpleNamespace(headers={"retry-after": "3"}),
                             body={"message": "bad key sk-secret"}, message="fallback")
    err = status_failure("p", answer, secret="sk-secret", key_variable="P_KEY")
    assert (err.type, err.non_retryable) == (kind, not retryable)
    assert "sk-secret" not in err.message and f"({status})" in err.message
    assert err.next_retry_delay == (timedelta(seconds=3) if retryable else None)


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
async def test_a_refused_connection_is_retryable(name: str, monkeypatch: pytest.MonkeyPatch):
    protocol = PROTOCOLS[name]
    async with protocol.stub_class("k") as stub:
        closed = stub.base_url
    monkeypatch.setenv(protocol.key_variable, "k")
    monkeypatch.setenv(protocol.base_url_variable, closed)
    backend = make_backend(name, protocol.model_name, timeout_seconds=5)
    turn = ModelTurnInput(task_id="t", scenario="s", turn=1, messages=[ChatMessage(role="user", content="hi")],
                          tools=[])
    with pytest.raises(ApplicationError) as caught:
        await backend.reply(turn, [])
    await backend.aclose()
    assert caught.value.type == UNAVAILABLE and not caught.value.non_retryable
    assert "unreachable at http://127.0.0.1:" in caught.value.message


def test_unusable_replies_are_retryable():
    for parse, body in ((reply_from_completion, {"choices": []}), (reply_from_message, {"type": "message"})):
        with pytest.raises(ApplicationError) as caught:
            parse(body)
        assert caught.value.type == UNUSABLE and not caught.value.non_retryable


@pytest.mark.parametrize("model", ["openai"], indirect=True)
async def test_a_model_that_sends_megabytes_cannot_brick_its_task(client: Client, model: _Protocol, world: World):
    """700 KB of arguments in each of several calls, a dozen calls at once, then a 1.1 MB final answer,
    from a server speaking the real protocol: every turn's payload stays small, the calls are answered
    malformed_arguments, the refund still happens once and the task completes with its answer cut."""
    huge = json.dumps({**REFUND, "reason": "x" * 700_000})
    model.stub.queue(
        model.calls(*[("issue_refund", huge, f"huge{i}") for i in range(3)]),
        model.calls(*[("search_policy", {"query": "y" * 19_000}, f"many{i}") for i in range(12)]),
        model.calls(("issue_refund", REFUND, "fixed")),
        model.text("z" * 1_100_000),
    )
    async with running_worker(client, model.settings):
        handle = await start(client, model.settings, scenario_task("SU-88421"))
        result = await finished(handle)
    assert result.state == "completed"
    assert [r["amount_cents"] for r in world.refunds("SU-88421")] == [11800]
    answers = model.results(model.requests[1])
    assert [a["reason"] for _, a in answers] == ["malformed_arguments"] * 3
    assert "700" in answers[0][1]["message"]
    assert len(model.results(model.requests[2])) == 8, "calls beyond the bound are dropped, and said so"
    assert len(result.final_answer) < 10_000 and "were cut" in result.final_answer
    history = await handle.fetch_history()
    assert max(len(e.SerializeToString()) for e in history.events) < 300_000
    assert all(len(json.dumps(r.body)) < 400_000 for r in model.requests), "no turn resends the megabytes"
