"""The provider's and the courier's HTTP connections: the environment's proxy chosen once, when they are
made; the stripe SDK allowed to resend only a request that never left; the send-by fence last."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import stripe
import urllib3

from activities.courier import CourierGateway
from activities.effects import Ambiguous, Rejected
from activities.payments import FencedClient, NotSent, StripeGateway, fenced_pool, send_before
from devstack.processes import free_port

BASE = "http://127.0.0.1:8420"


_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No proxy variable of the machine's, in either case, leaks into a test."""
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


def _proxy_of(pool: urllib3.PoolManager) -> str | None:
    return pool.proxy.host if isinstance(pool, urllib3.ProxyManager) and pool.proxy else None


def test_a_proxy_in_the_environment_is_kept_for_the_pool(environment: pytest.MonkeyPatch) -> None:
    environment.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    assert _proxy_of(fenced_pool(BASE, 5.0)) == "proxy.internal"


def test_all_proxy_and_a_proxy_without_a_scheme_are_read_as_requests_reads_them(
        environment: pytest.MonkeyPatch) -> None:
    environment.setenv("ALL_PROXY", "proxy.internal:3128")
    assert _proxy_of(fenced_pool(BASE, 5.0)) == "proxy.internal"


def test_the_proxy_s_credentials_go_with_every_request(environment: pytest.MonkeyPatch) -> None:
    environment.setenv("HTTP_PROXY", "http://agent:s3cret@proxy.internal:3128")
    pool = fenced_pool(BASE, 5.0)
    assert isinstance(pool, urllib3.ProxyManager)
    assert pool.proxy_headers == urllib3.make_headers(proxy_basic_auth="agent:s3cret")


@pytest.mark.parametrize(("base", "no_proxy"), [(BASE, "127.0.0.1"), (BASE, "10.0.0.0/8,127.0.0.0/8"),
                                               ("http://stripe-mock:12111", "stripe-mock:12111")])
def test_no_proxy_for_the_base_url_leaves_it_direct(environment: pytest.MonkeyPatch, base: str,
                                                    no_proxy: str) -> None:
    environment.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    environment.setenv("NO_PROXY", no_proxy)
    assert _proxy_of(fenced_pool(base, 5.0)) is None


@contextmanager
def _provider(answer: bytes | None) -> Iterator[tuple[str, list[bytes]]]:
    """A provider on loopback that reads each request and then sends `answer` and closes, or with None
    closes without a word; yields its base URL and the requests it received."""
    server = socket.create_server(("127.0.0.1", 0))
    address = server.getsockname()
    received: list[bytes] = []
    last: list[tuple[str, int]] = []

    def serve() -> None:
        while True:
            conn, peer = server.accept()
            with conn:
                if last and peer == last[0]:
                    return
                received.append(conn.recv(65536))
                if answer is not None:
                    conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{address[1]}", received
    finally:
        # A connection the client opened and dropped may still wait in the listen queue: one more of our
        # own, queued behind it, tells the server to stop once it has read every earlier one.
        with socket.socket() as closing:
            closing.bind(("127.0.0.1", 0))
            last.append(closing.getsockname())
            closing.connect(address)
            thread.join(timeout=5)
        server.close()
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
    """Refused connections: nothing left, so the SDK's client resends while it has retries left."""
    base = f"http://127.0.0.1:{free_port()}"
    client = FencedClient(base, 5.0)
    with pytest.raises(stripe.APIConnectionError) as failed:
        client.request("post", f"{base}/v1/refunds", {}, "amount=100")
    assert isinstance(failed.value.__cause__, urllib3.exceptions.NewConnectionError)
    assert client._should_retry(None, failed.value, 0, 2)
    assert not client._should_retry(None, failed.value, 2, 2)


def test_a_request_past_its_send_by_time_sends_no_byte() -> None:
    """The fence is the last thing before the bytes, after the connection is open, and its NotSent
    reaches the caller as it is (not as a connection error the effect protocol would read as ambiguous)."""
    with _provider(None) as (base, received):
        gateway = StripeGateway("sk_test_x", base, 5.0, sdk_retries=2)
        with send_before(time.time() - 1), pytest.raises(NotSent):
            gateway.refund("pi_1", 100, "key-1", {})
    assert received == [b""]  # a connection was opened, and closed with nothing written on it


def test_a_redirect_is_not_followed() -> None:
    """A POST answered with a redirect may have been executed: the answer goes to the caller, once."""
    moved = b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /v1/elsewhere\r\nContent-Length: 0\r\n\r\n"
    with _provider(moved) as (base, received):
        gateway = StripeGateway("sk_test_x", base, 5.0, sdk_retries=2)
        with pytest.raises(stripe.StripeError):
            gateway.refund("pi_1", 100, "key-1", {})
    assert len(received) == 1 and received[0].startswith(b"POST /v1/refunds")


@pytest.mark.parametrize(("answer", "error"), [
    (None, Ambiguous),  # read, then dropped: it may have booked
    (b"HTTP/1.1 503 Unavailable\r\nContent-Length: 0\r\n\r\n", Ambiguous),
    (b"HTTP/1.1 303 See Other\r\nLocation: /v1/pickups/1\r\nContent-Length: 0\r\n\r\n", Ambiguous),
    (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\nno", Rejected),
])
def test_the_courier_s_answers_are_read_for_what_they_say_of_the_booking(answer: bytes | None,
                                                                       error: type[Exception]) -> None:
    with _provider(answer) as (base, received):
        with pytest.raises(error) as failed:
            CourierGateway(base).book("ORD-1", "item-1", "a@b.c", "key-1")
    assert len(received) == 1
    assert type(failed.value) is error


def test_a_courier_that_cannot_be_reached_booked_nothing() -> None:
    with pytest.raises(Rejected):
        CourierGateway(f"http://127.0.0.1:{free_port()}").book("ORD-1", "item-1", "a@b.c", "key-1")
