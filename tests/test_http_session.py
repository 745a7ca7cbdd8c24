"""The provider's and the courier's HTTP connections: the environment read once, when they are made,
and the stripe SDK allowed to resend only a request that never left."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import stripe
import urllib3

from activities.payments import StripeGateway, fenced_pool
from devstack.processes import free_port

BASE = "http://127.0.0.1:8420"


def test_a_proxy_in_the_environment_is_kept_for_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    pool = fenced_pool(BASE)
    assert isinstance(pool, urllib3.ProxyManager)
    assert pool.proxy is not None and pool.proxy.host == "proxy.internal"


def test_no_proxy_for_the_base_url_leaves_it_direct(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert not isinstance(fenced_pool(BASE), urllib3.ProxyManager)


def test_the_environment_changed_later_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    pool = fenced_pool(BASE)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    assert not isinstance(pool, urllib3.ProxyManager)
    assert pool.connection_from_url(BASE).host == "127.0.0.1"


@contextmanager
def _provider(answer: bytes | None) -> Iterator[tuple[str, list[bytes]]]:
    """A provider on loopback that reads each request and then sends `answer` and closes, or with None
    closes without a word; yields its base URL and the requests it received."""
    server = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                received.append(conn.recv(65536))
                if answer is not None:
                    conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}", received
    finally:
        server.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not, on Linux)
        server.close()
        thread.join(timeout=5)
        assert not thread.is_alive()


def test_a_request_that_reached_the_provider_is_never_resent_by_the_sdk() -> None:
    """The connection dropped after the request was read: it may have been executed, so the SDK, allowed
    two retries, sends it once and the caller gets the ambiguity."""
    with _provider(None) as (base, received):
        gateway = StripeGateway("sk_test_x", base, 5.0, sdk_retries=2)
        with pytest.raises(stripe.APIConnectionError) as failed:
            gateway.refund("pi_1", 100, "key-1", {})
    assert failed.value.should_retry is False
    assert len(received) == 1 and received[0].startswith(b"POST /v1/refunds")


def test_the_connection_pool_retries_nothing_of_its_own() -> None:
    """Not even a read, which urllib3 would otherwise resend after a dropped connection: every retry is
    the caller's (the SDK's rule above, or Temporal's) and so is counted and seen."""
    with _provider(None) as (base, received):
        gateway = StripeGateway("sk_test_x", base, 5.0, sdk_retries=0)
        with pytest.raises(stripe.APIConnectionError):
            gateway.refunds("pi_1")
    assert len(received) == 1 and received[0].startswith(b"GET /v1/refunds")


def test_a_conflict_is_resent_with_the_same_key() -> None:
    """A 409 says the key's first request is still running and this one executed nothing: resent, same key."""
    conflict = (b"HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                b"Connection: close\r\n\r\n{}")
    with _provider(conflict) as (base, received):
        gateway = StripeGateway("sk_test_x", base, 5.0, sdk_retries=2)
        with pytest.raises(stripe.StripeError):
            gateway.refund("pi_1", 100, "key-1", {})
    assert len(received) == 3
    assert all(b"Idempotency-Key: key-1" in r for r in received)


def test_a_provider_that_cannot_be_reached_is_tried_again() -> None:
    """Refused connections: nothing left, so the SDK may try again (and says it may)."""
    gateway = StripeGateway("sk_test_x", f"http://127.0.0.1:{free_port()}", 5.0, sdk_retries=0)
    with pytest.raises(stripe.APIConnectionError) as failed:
        gateway.refund("pi_1", 100, "key-1", {})
    assert failed.value.should_retry is True
    assert isinstance(failed.value.__cause__, urllib3.exceptions.NewConnectionError)
