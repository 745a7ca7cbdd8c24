"""A courier booking API stand-in on loopback, for the courier tool's tests and demos.

    POST /v1/pickups          {order_id, item_id, contact, client_reference} -> a booking
    GET  /v1/pickups?order_id  the order's bookings, read-after-write consistent

Its idempotency rule is its own: with `dedupe_seconds` set, a POST whose client_reference was
booked within that many seconds answers the earlier booking; with None it books again, every
time. `stall_next` makes the next POSTs book and then hold their answer for `stall_seconds` (a
courier that accepts and then times out).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


@dataclass
class CourierAPI:
    dedupe_seconds: float | None = 600.0
    stall_next: int = 0
    stall_seconds: float = 3.0
    bookings: list[dict[str, Any]] = field(default_factory=list)
    posts: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("start() the courier first")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> CourierAPI:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                status, body, stall = api._book(json.loads(self.rfile.read(length) or b"{}"))
                if stall:
                    api._stopping.wait(api.stall_seconds)
                self._answer(status, body)

            def do_GET(self) -> None:
                query = parse_qs(urlparse(self.path).query)
                order_id = query.get("order_id", [None])[0]
                with api._lock:
                    data = [dict(b) for b in api.bookings if order_id is None or b["order_id"] == order_id]
                self._answer(200, {"data": data})

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                raw = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting: the booking stands all the same

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="courier-api", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _book(self, request: dict[str, Any]) -> tuple[int, dict[str, Any], bool]:
        missing = [f for f in ("order_id", "item_id", "client_reference") if not request.get(f)]
        if missing:
            return 400, {"error": f"missing {', '.join(missing)}"}, False
        now = time.time()
        with self._lock:
            self.posts += 1
            stall = self.stall_next > 0
            self.stall_next -= 1 if stall else 0
            if self.dedupe_seconds is not None:
                earlier = next((b for b in self.bookings if b["client_reference"] == request["client_reference"]
                                and now - b["created"] <= self.dedupe_seconds), None)
                if earlier is not None:
                    return 200, dict(earlier), stall
            booking = {"id": f"pk_{next(self._ids):05d}", "order_id": request["order_id"],
                       "item_id": request["item_id"], "contact": request.get("contact", ""),
                       "client_reference": request["client_reference"], "status": "booked", "created": now}
            self.bookings.append(booking)
        return 201, dict(booking), stall
