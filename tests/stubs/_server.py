"""A provider stub: one aiohttp app on 127.0.0.1 (a port the OS picks) that answers each request with
the next scripted reply and records every request it received."""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web


@dataclass(frozen=True)
class Reply:
    """One scripted HTTP answer: a status, a JSON body, extra headers, and how long the model takes."""

    body: dict[str, Any]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    latency: float = 0.0

    def slow(self, seconds: float) -> Reply:
        return replace(self, latency=seconds)


@dataclass(frozen=True)
class Request:
    """One request as the stub received it, and the status it answered."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    received_at: float
    status: int


class StubServer:
    """Subclasses name the route and check requests as the protocol documents them."""

    route = "/"

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Request] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def queue(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def __aenter__(self) -> StubServer:
        app = web.Application()
        app.router.add_post(self.route, self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = {"_unparsed": raw.decode(errors="replace")}
        headers = {k.lower(): v for k, v in request.headers.items()}
        problem = self.check(headers, body)
        if problem is not None:
            reply = problem
        elif self.replies:
            reply = self.replies.popleft()
        else:
            reply = self.error(400, "stub: no scripted reply left for this request")
        self.requests.append(Request(request.path, headers, body, time.monotonic(), reply.status))
        if reply.latency:
            await asyncio.sleep(reply.latency)
        return web.json_response(reply.body, status=reply.status, headers=reply.headers)

    def check(self, headers: dict[str, str], body: dict[str, Any]) -> Reply | None:
        """A 4xx reply for a request the real API would refuse, else None."""
        return None

    def error(self, status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
        raise NotImplementedError
