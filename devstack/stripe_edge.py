"""A Stripe edge on loopback, in front of localstripe: Stripe's idempotency, and faults by rule.

Mode `dedupe` behaves as Stripe does with Idempotency-Key: the same key with the same
parameters replays the first saved response (errors included) for 24 hours, the same key
with other parameters is a 400 idempotency error, and a request whose key is still in
flight is a 409. Mode `passthrough` forwards keys untouched, as localstripe alone does
(a provider that does not protect you).

Faults sit on the network side of the provider: `*_before_commit` never reach it,
`*_after_commit` reach it and lose or spoil the answer; `refund_failed` makes the refund and fails it
at once (as a card that cannot take it does). Rules match method and path
prefix (and, with `tasks` / `skip_tasks`, the task their metadata names) and pick requests by
their count (`nth`, `from_nth`); `probability` then lets a picked
request through the rule only on that fraction of draws (a `random.Random` seeded by the
config's `seed`, so one run of requests in one order draws the same faults). Control plane:
PUT /_edge/config {"mode": ..., "rules": [...]} (also forgets saved keys and counters, like
a fresh account), GET /_edge/stats, POST /_edge/fail_refund (a refund that fails after it was
made). A rule with a `label` also counts under `fault:<label>` and notes each request it fires
on (its metadata's task_id and intent_key): GET /_edge/marked.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from typing import Literal

from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import BaseModel, Field, ValidationError

Fault = Literal[
    "timeout_after_accept", "error_after_commit", "drop_after_commit",
    "error_before_commit", "drop_before_commit", "conflict_before_commit", "slow", "fail", "refund_failed",
]
BEFORE = {"error_before_commit", "drop_before_commit", "conflict_before_commit", "fail"}
AFTER = {"timeout_after_accept", "error_after_commit", "drop_after_commit"}
KEY_TTL_SECONDS = 24 * 3600
log = logging.getLogger("stripe_edge")


class Rule(BaseModel):
    fault: Fault
    method: str = "POST"
    path: str = "/v1/refunds"
    nth: list[int] | None = Field(default=None, description="which matching requests, counted from 1")
    from_nth: int | None = None
    after_rule: int | None = Field(default=None, description="only once the rule at this index has fired")
    delay_seconds: float = 0.0
    probability: float | None = Field(default=None, ge=0.0, le=1.0,
                                      description="fire on this fraction of the requests picked above")
    label: str | None = Field(default=None, description="count under fault:<label> and note each request")
    tasks: list[str] | None = Field(default=None, description="only requests whose metadata names one of these tasks")
    skip_tasks: list[str] = Field(default_factory=list,
                                  description="never requests whose metadata names one of these tasks")

    def concerns(self, method: str, path: str, task: str | None) -> bool:
        return method == self.method and path.startswith(self.path) and task not in self.skip_tasks \
            and (self.tasks is None or task in self.tasks)

    def picks(self, count: int) -> bool:
        if self.nth is not None:
            return count in self.nth
        if self.from_nth is not None:
            return count >= self.from_nth
        return True


class EdgeConfig(BaseModel):
    mode: Literal["dedupe", "passthrough"] = "dedupe"
    rules: list[Rule] = Field(default_factory=list)
    seed: int = Field(default=0, description="seeds the draws of rules with a probability")


@dataclass
class _Saved:
    fingerprint: str
    created: float
    status: int | None = None
    body: bytes = b""
    content_type: str = "application/json"


class Edge:
    """Installed in front of localstripe's own app (`install`): its first middleware, in the same process,
    so a request is parsed once and forwarded by a function call, not by a second HTTP request over
    loopback (which cost a quarter of the provider's CPU per request)."""

    def __init__(self, config: EdgeConfig) -> None:
        self.config = config
        self._counts: Counter[int] = Counter()
        self._fired: set[int] = set()
        self._keys: dict[str, _Saved] = {}
        self._rng = random.Random(config.seed)
        self.stats: Counter[str] = Counter()
        self.marked: list[dict[str, str | float | None]] = []
        self._control: dict[tuple[str, str], Handler] = {}

    def install(self, app: web.Application) -> None:
        """Put the edge, and its control plane, in front of every route of `app` (not yet started)."""
        self._control = {("PUT", "/_edge/config"): self._put_config, ("GET", "/_edge/config"): self._get_config,
                         ("GET", "/_edge/stats"): self._get_stats, ("GET", "/_edge/marked"): self._get_marked,
                         ("POST", "/_edge/fail_refund"): self._fail_refund}
        app.middlewares.insert(0, self._middleware)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        control = self._control.get((request.method, request.path))
        if control is not None:  # the edge's own: never localstripe's (nor behind its API key)
            return await control(request)
        return await self._handle(request, handler)

    async def _put_config(self, request: web.Request) -> web.Response:
        try:
            self.config = EdgeConfig.model_validate_json(await request.read())
        except ValidationError as err:
            return web.json_response({"error": json.loads(err.json())}, status=400)
        self._counts.clear()
        self._fired.clear()
        self._keys.clear()
        self._rng = random.Random(self.config.seed)
        self.stats.clear()
        self.marked.clear()
        return web.json_response(self.config.model_dump())

    async def _get_config(self, request: web.Request) -> web.Response:
        return web.json_response(self.config.model_dump())

    async def _get_stats(self, request: web.Request) -> web.Response:
        return web.json_response(dict(self.stats))

    async def _get_marked(self, request: web.Request) -> web.Response:
        return web.json_response(self.marked)

    async def _fail_refund(self, request: web.Request) -> web.Response:
        """What Stripe does to a refund days later when the card can no longer take it: {"id": "re_...",
        "status": "failed" or "canceled"}. The refund's money goes back to the merchant."""
        from localstripe import resources  # the edge runs in localstripe's process (localstripe_server)

        body = await request.json()
        if body.get("status") not in ("failed", "canceled"):
            return _stripe_error(400, "invalid_request_error", "status must be failed or canceled")
        try:
            refund = resources.Refund._api_retrieve(str(body.get("id")))
        except resources.UserError:
            return _stripe_error(404, "invalid_request_error", f"no refund {body.get('id')}")
        refund.status = body["status"]
        refund.failure_reason = "expired_or_canceled_card"
        return web.json_response({"id": refund.id, "status": refund.status})

    def _rule_for(self, method: str, path: str, task: str | None) -> Rule | None:
        chosen = None
        for index, rule in enumerate(self.config.rules):
            if not rule.concerns(method, path, task):
                continue
            if rule.after_rule is not None and rule.after_rule not in self._fired:
                continue
            self._counts[index] += 1
            if chosen is None and rule.picks(self._counts[index]) and self._draw(rule):
                chosen = rule
                self._fired.add(index)
        return chosen

    def _draw(self, rule: Rule) -> bool:
        """After count and order picked the request: fire on `probability` of them (always when unset)."""
        return rule.probability is None or self._rng.random() < rule.probability

    async def _handle(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        body = await request.read()
        self.stats[f"{request.method} {request.path}"] += 1
        form = urllib.parse.parse_qs(body.decode("utf-8", "replace"))
        rule = self._rule_for(request.method, request.path, form.get("metadata[task_id]", [None])[0])
        if rule is not None:
            self.stats[f"fault:{rule.fault}"] += 1
            self.stats[f"fault:{rule.fault}:{request.method}"] += 1  # a slow GET and a slow POST differ
            if rule.label:
                self.stats[f"fault:{rule.label}"] += 1
                self.marked.append({"label": rule.label, "at": time.time(),
                                    "task_id": form.get("metadata[task_id]", [None])[0],
                                    "intent_key": form.get("metadata[intent_key]", [None])[0]})
            if rule.delay_seconds and rule.fault not in AFTER:
                await asyncio.sleep(rule.delay_seconds)
            if rule.fault in BEFORE:
                return _before_commit(request, rule)

        key = request.headers.get("Idempotency-Key")
        if self.config.mode == "dedupe" and request.method == "POST" and key:
            status, payload, ctype = await self._idempotent(request, handler, key, body)
        else:
            status, payload, ctype = await _forward(request, handler)

        if rule is not None and rule.fault == "refund_failed" and status == 200:
            payload = _failed(payload)
            if key in self._keys:  # a retry with the key replays the refund as it was answered
                self._keys[key].body = payload
        if rule is not None and rule.fault in AFTER:
            if rule.fault == "timeout_after_accept":
                await asyncio.sleep(rule.delay_seconds)
            elif rule.fault == "error_after_commit":
                return _stripe_error(500, "api_error", "injected: error after commit")
            else:
                _drop(request)
        return web.Response(status=status, body=payload, content_type=ctype)

    async def _idempotent(self, request: web.Request, handler: Handler, key: str,
                          body: bytes) -> tuple[int, bytes, str]:
        fingerprint = hashlib.sha256(f"{request.method} {request.path}\n".encode() + body).hexdigest()
        saved = self._keys.get(key)
        if saved is not None and time.time() - saved.created > KEY_TTL_SECONDS:
            del self._keys[key]
            saved = None
        if saved is not None:
            if saved.fingerprint != fingerprint:
                self.stats["idempotency_mismatch"] += 1
                return _error_tuple(400, "idempotency_error",
                                    f"Keys for idempotent requests can only be used with the same parameters "
                                    f"they were first used with. Try using a key other than '{key}'.")
            if saved.status is None:
                self.stats["idempotency_conflict"] += 1
                return _error_tuple(409, "idempotency_error",
                                    "There is currently another in-progress request using this idempotency key.")
            self.stats["idempotency_replay"] += 1
            return saved.status, saved.body, saved.content_type
        saved = self._keys[key] = _Saved(fingerprint, time.time())
        try:
            status, payload, ctype = await _forward(request, handler)
        except BaseException:
            self._keys.pop(key, None)
            raise
        if status in (400, 401, 404, 409, 429):
            self._keys.pop(key, None)  # Stripe saves nothing when the request never began executing
        else:
            saved.status, saved.body, saved.content_type = status, payload, ctype
        return status, payload, ctype


async def _forward(request: web.Request, handler: Handler) -> tuple[int, bytes, str]:
    """localstripe's answer to the request (its body already read, and kept by aiohttp for the handler).
    A crash of localstripe's is answered as its own server answered it, a 500, which a key keeps."""
    try:
        response = await handler(request)
    except web.HTTPException as refused:  # the router's 404 / 405: an answer like any other
        response = refused
    except Exception:
        log.exception("localstripe failed on %s %s", request.method, request.path)
        return 500, b"500 Internal Server Error\n\nServer got itself in trouble", "text/plain"
    body = response.body if isinstance(response, web.Response) else None
    if not isinstance(body, bytes):
        raise TypeError(f"localstripe answered {request.method} {request.path} with a body the edge cannot keep")
    return response.status, body, response.content_type


def _failed(payload: bytes) -> bytes:
    """A refund the provider made and failed at once (fault `refund_failed`): so it stays, and so it answers."""
    from localstripe import resources  # the edge runs in localstripe's process (localstripe_server)

    refund = json.loads(payload)
    stored = resources.Refund._api_retrieve(refund["id"])
    stored.status = refund["status"] = "failed"
    stored.failure_reason = refund["failure_reason"] = "expired_or_canceled_card"
    return json.dumps(refund).encode()


def _before_commit(request: web.Request, rule: Rule) -> web.StreamResponse:
    if rule.fault == "drop_before_commit":
        _drop(request)
        return web.Response(status=500)
    if rule.fault == "conflict_before_commit":
        return _stripe_error(409, "idempotency_error", "injected: another request with this key is in progress")
    return _stripe_error(500, "api_error", f"injected: {rule.fault}")


def _drop(request: web.Request) -> None:
    """Close the connection without an answer: the client sees a dropped connection."""
    if request.transport is not None:
        request.transport.abort()


def _error_tuple(status: int, kind: str, message: str) -> tuple[int, bytes, str]:
    return status, json.dumps({"error": {"type": kind, "message": message}}).encode(), "application/json"


def _stripe_error(status: int, kind: str, message: str) -> web.Response:
    code, payload, ctype = _error_tuple(status, kind, message)
    return web.Response(status=code, body=payload, content_type=ctype)
