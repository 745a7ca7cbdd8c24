"""The payment provider seam: the real `stripe` SDK, pointed at Stripe or a local server.

Who retries what:
- The SDK retries only requests that provably never took effect: a connection that was
  never established, a 409 (the key's first request still in flight) and a 429. Never a
  timeout, a dropped connection or a 5xx: those may have been executed, and against a
  provider that ignores idempotency keys a resend pays twice.
- Temporal retries the activity. Every attempt sends the same idempotency key (the intent
  key, also in the object's metadata), and an attempt that follows an ambiguous one looks
  the intent up at the provider before sending anything.
- The model may ask again; the workflow's journal and the ledger answer already_performed.

A request may leave only before its attempt's send-by time (`send_before`): a worker that was
paused between its ledger claim and its request and wakes up late sends nothing, so the next
attempt can rely on the previous holder's settle horizon (activities/effects.py). The check runs
in the HTTP connection itself, after the connection is open and immediately before the request's
first bytes are written, and again before its body's (`fenced_pool`): what is left between the last
check and the request's last byte is one function return.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import urlsplit

import stripe
import urllib3
from requests.utils import get_auth_from_url, get_environ_proxies, prepend_scheme_if_needed, select_proxy
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

KEY_FIELD = "intent_key"

_send_by: ContextVar[float | None] = ContextVar("send_by", default=None)


class NotSent(Exception):
    """The send-by time passed before the request left: the provider never saw it."""


@contextmanager
def send_before(deadline: float) -> Iterator[None]:
    """Requests made inside leave only before `deadline` (time.time()); later ones raise NotSent."""
    token = _send_by.set(deadline)
    try:
        yield
    finally:
        _send_by.reset(token)


def check_send_by(what: str, clock: Callable[[], float] = time.time) -> None:
    """Raise NotSent when the current attempt's send-by time has passed; every gateway calls it
    right before a request leaves (`clock`: the wall clock, or a simulator's)."""
    deadline = _send_by.get()
    now = clock()
    if deadline is not None and now >= deadline:
        raise NotSent(f"{what} not sent: its send-by time passed {now - deadline:.1f} s ago")


class _FencedHTTP(HTTPConnection):
    """Checks the send-by time as the request's first bytes are written (http.client's endheaders), and
    again before each write of its body: urllib3 writes the headers, then the body on its own, and a
    request is whole (a provider acts on it) only with its body's last byte. A check that fails between
    them raises NotSent; urllib3 then closes the connection, and the provider drops the half request."""

    def putrequest(self, method: str, url: str, *args: Any, **kwargs: Any) -> None:
        self._fenced_what = f"{method} {url.split('?')[0]}"
        self._fenced_headers_sent = False
        super().putrequest(method, url, *args, **kwargs)

    def endheaders(self, message_body: Any = None, *, encode_chunked: bool = False) -> None:
        if self.sock is None:  # plain HTTP opens its connection on the first write: open it first, so
            self.connect()     # that the check is the last thing before the bytes, not before a connect
        check_send_by(getattr(self, "_fenced_what", "request"))
        super().endheaders(message_body, encode_chunked=encode_chunked)
        self._fenced_headers_sent = True

    def send(self, data: Any) -> None:
        if getattr(self, "_fenced_headers_sent", False):  # the body, after the headers left
            check_send_by(f"{getattr(self, '_fenced_what', 'request')}'s body")
        super().send(data)


class _FencedHTTPS(_FencedHTTP, HTTPSConnection):
    pass


class _FencedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _FencedHTTP


class _FencedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _FencedHTTPS


def fenced_pool(base_url: str, timeout_seconds: float, pool_size: int = 32,
                ca_certs: str | None = None) -> urllib3.PoolManager:
    """Connections to `base_url` whose every request checks the send-by time just before its bytes
    leave, and waits at most `timeout_seconds` to connect and as long for each read. No retries and no
    redirects of their own: who retries what is decided by the caller.

    The environment's proxy for `base_url` is chosen here, once, by requests' rules (HTTPS_PROXY,
    HTTP_PROXY, ALL_PROXY; NO_PROXY with hosts, ports and CIDR ranges; credentials in the proxy's URL):
    a client that reads the environment on every request spends a tenth of a refund's CPU on it. No
    ~/.netrc is ever consulted, so nothing can replace the provider's Authorization header."""
    options: dict[str, Any] = {"num_pools": 4, "maxsize": pool_size, "retries": False,
                               "timeout": urllib3.Timeout(connect=timeout_seconds, read=timeout_seconds)}
    if ca_certs is not None:
        options.update(cert_reqs="CERT_REQUIRED", ca_certs=ca_certs)
    proxy = select_proxy(base_url, get_environ_proxies(base_url))
    if proxy:
        proxy = prepend_scheme_if_needed(proxy, "http")
        user, password = get_auth_from_url(proxy)
        auth = urllib3.make_headers(proxy_basic_auth=f"{user}:{password}") if user else None
        pool: urllib3.PoolManager = urllib3.ProxyManager(proxy, proxy_headers=auth, **options)
    else:
        pool = urllib3.PoolManager(**options)
    pool.pool_classes_by_scheme = {"http": _FencedHTTPPool, "https": _FencedHTTPSPool}
    return pool


@dataclass(frozen=True, slots=True)
class Refund:
    """A refund as the provider holds it: the fields of Stripe's Refund object that we read.

    Read from the response's JSON rather than through the SDK's objects, which for one list of two
    refunds cost 0.3 ms of CPU to build (the request itself 0.13 ms), three lists a refund ticket."""

    object: ClassVar[str] = "refund"  # Stripe's name of the type, as on its objects
    id: str
    amount: int
    status: str
    payment_intent: str | None
    metadata: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Refund:
        return cls(id=data["id"], amount=data["amount"], status=data["status"],
                   payment_intent=data.get("payment_intent"), metadata=dict(data.get("metadata") or {}))


class StripeGateway:
    PAGE = 100  # objects per list request: Stripe's most

    def __init__(self, api_key: str, api_base: str, timeout_seconds: float, sdk_retries: int = 2) -> None:
        self._client = stripe.StripeClient(
            api_key,
            base_addresses={"api": api_base},
            max_network_retries=sdk_retries,
            http_client=FencedClient(api_base, timeout_seconds),
        )

    def ping(self) -> None:
        self._client.v1.customers.list(params={"limit": 1})

    def create_customer(self, name: str, email: str) -> str:
        return self._client.v1.customers.create(params={"name": name, "email": email}).id

    def customer_exists(self, customer_id: str) -> bool:
        try:
            self._client.v1.customers.retrieve(customer_id)
            return True
        except stripe.InvalidRequestError:
            return False

    def charge(self, customer_id: str, amount_cents: int, currency: str, metadata: dict[str, str],
               key: str) -> Any:
        """A confirmed card payment (the customer's order, or our payment of an invoice)."""
        return self._client.v1.payment_intents.create(
            params={"amount": amount_cents, "currency": currency, "customer": customer_id,
                    "payment_method": "pm_card_visa", "confirm": True, "metadata": metadata},
            options={"idempotency_key": key},
        )

    def refund(self, payment_intent_id: str, amount_cents: int, key: str, metadata: dict[str, str]) -> Refund:
        response = self._client.raw_request("post", "/v1/refunds", payment_intent=payment_intent_id,
                                            amount=amount_cents, metadata={**metadata, KEY_FIELD: key},
                                            idempotency_key=key)
        return Refund.of(response.data)

    def refunds(self, payment_intent_id: str) -> list[Refund]:
        """All refunds of a PaymentIntent, every page. Stripe's list endpoints are read-after-write
        consistent."""
        refunds: list[Refund] = []
        after: dict[str, str] = {}
        while True:
            page = self._client.raw_request("get", "/v1/refunds", payment_intent=payment_intent_id,
                                            limit=self.PAGE, **after).data
            refunds += [Refund.of(r) for r in page["data"]]
            if not page.get("has_more") or not page["data"]:
                return refunds
            after = {"starting_after": page["data"][-1]["id"]}

    def find_refund(self, payment_intent_id: str, key: str) -> Refund | None:
        return next((r for r in self.refunds(payment_intent_id) if intent_key_of(r) == key), None)

    def refunded_cents(self, payment_intent_id: str) -> int:
        return sum(r.amount for r in self.refunds(payment_intent_id) if r.status in ("succeeded", "pending"))

    def payment_exists(self, payment_intent_id: str) -> bool:
        try:
            return self._client.v1.payment_intents.retrieve(payment_intent_id).status == "succeeded"
        except stripe.InvalidRequestError:
            return False

    def payments(self) -> list[Any]:
        """Every PaymentIntent of the account."""
        return list(self._client.v1.payment_intents.list(params={"limit": 100}).auto_paging_iter())

    def payments_to(self, customer_id: str) -> list[Any]:
        """Our payments to a payee: the provider's list of the customer's PaymentIntents (checked here
        too, so a provider that ignored the filter could not hand us another customer's)."""
        page = self._client.v1.payment_intents.list(params={"customer": customer_id, "limit": self.PAGE})
        return [p for p in page.auto_paging_iter() if p.customer == customer_id]


class FencedClient(stripe.HTTPClient):
    """The SDK's HTTP client, on urllib3 through `fenced_pool`, allowed to retry only what never reached
    the provider. (The SDK's own client goes through requests, which cost 0.23 ms of CPU per request
    over urllib3's 0.20 in a profile, on four provider requests a refund.)"""

    name = "urllib3"

    def __init__(self, base_url: str, timeout_seconds: float) -> None:
        super().__init__()
        self._pool = fenced_pool(base_url, timeout_seconds, ca_certs=stripe.ca_bundle_path)

    def request(self, method: str, url: str, headers: Mapping[str, str] | None, post_data: Any = None, *,
                _usage: list[str] | None = None) -> tuple[Any, int, Mapping[str, str]]:  # the body's bytes
        response = self._send(method, url, headers, post_data, stream=False)
        return response.data, response.status, response.headers

    def request_stream(self, method: str, url: str, headers: Mapping[str, str] | None, post_data: Any = None, *,
                       _usage: list[str] | None = None) -> tuple[Any, int, Mapping[str, str]]:
        response = self._send(method, url, headers, post_data, stream=True)
        return response, response.status, response.headers

    def _send(self, method: str, url: str, headers: Mapping[str, str] | None, post_data: Any,
              stream: bool) -> urllib3.BaseHTTPResponse:
        try:
            return self._pool.request(method, url, headers=dict(headers or {}), body=post_data,
                                      redirect=False, preload_content=not stream)
        except NotSent:  # the fence, not the network: it must reach the effect protocol as it is
            raise
        except Exception as err:  # as the SDK's own client: whatever stops the call is a connection error
            raise stripe.APIConnectionError(  # type: ignore[no-untyped-call]  # the SDK's constructor is untyped
                f"could not complete {method.upper()} {urlsplit(url).path}: "
                f"{type(err).__name__}", should_retry=never_sent(err)) from err

    def _should_retry(self, response: tuple[Any, int, Mapping[str, str] | None] | None,
                      api_connection_error: stripe.APIConnectionError | None, num_retries: int,
                      max_network_retries: int | None) -> bool:
        if num_retries >= (max_network_retries or 0):
            return False
        if response is None:
            return bool(api_connection_error and api_connection_error.should_retry)
        _, status, _ = response
        return status in (409, 429)

    def close(self) -> None:
        self._pool.clear()


def never_sent(error: Exception) -> bool:
    """True when the request provably did not leave: the connection was never established."""
    return isinstance(error, urllib3.exceptions.ConnectTimeoutError)  # NewConnectionError is one too


def metadata_of(obj: Any) -> dict[str, str]:
    """A provider object's metadata (a refund's, a payment's), empty when it has none."""
    metadata = obj.metadata
    if metadata is None:
        return {}
    return metadata.to_dict() if isinstance(metadata, stripe.StripeObject) else dict(metadata)


def intent_key_of(obj: Any) -> str | None:
    """The intent key our request wrote into a provider object's metadata: the one reader of it."""
    return metadata_of(obj).get(KEY_FIELD)
