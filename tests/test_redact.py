"""infra/redact.py: URLs keep scheme, host and port only; credentials become `***`; the same holds for
the real error strings of the HTTP clients we use, for activity failures with their cause chains as
Temporal serializes them, and for every log line the worker's process writes."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from datetime import timedelta

import aiohttp
import httpx2
import pytest
import requests
import urllib3
from aiohttp import ClientResponseError, RequestInfo
from multidict import CIMultiDict, CIMultiDictProxy
from temporalio import activity
from temporalio.api.failure.v1 import Failure
from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError, CancelledError
from yarl import URL

from activities.world import World
from core.models import ToolInput, ToolResult
from devstack.processes import free_port
from infra.redact import install_log_redaction, redact, redacted_error
from infra.settings import Settings
from infra.telemetry import JsonFormatter
from tests.helpers import checkpoint, running_worker, scenario_task, start, wait_for

SECRETS = ("SecretPath", "qtok", "pw-77", "abc123def", "hunter2", "dXNlcjpwYXNz")


@pytest.mark.parametrize(("text", "expected"), [
    ("http://ops:pw-77@hooks.example.com:8443/a/SecretPath?token=qtok#frag", "http://***@hooks.example.com:8443/***"),
    ("https://hooks.slack.com/services/T0/B0/SecretPath", "https://hooks.slack.com/***"),
    ("https://hooks.example.com?token=qtok", "https://hooks.example.com/***"),
    ("https://hooks.example.com#SecretPath", "https://hooks.example.com/***"),
    ("http://[::1]:8080/SecretPath?token=qtok", "http://[::1]:8080/***"),
    ("http://[2001:db8::1]/SecretPath", "http://[2001:db8::1]/***"),
    ("127.0.0.1:8080/SecretPath?token=qtok", "127.0.0.1:8080/***"),
    ("posting to hooks.example.com/a/SecretPath failed", "posting to hooks.example.com/*** failed"),
    ("ops:pw-77@localhost:9/SecretPath", "***@localhost:9/***"),
    ("protocol-relative //hooks.example.com/SecretPath", "protocol-relative //hooks.example.com/***"),
    ("at=127.0.0.1:9/SecretPath,", "at=127.0.0.1:9/***,"),
    ("POST to https://h.example/x/SecretPath?token=qtok failed (500).", "POST to https://h.example/*** failed (500)."),
    ("(see http://h.example/SecretPath)", "(see http://h.example/***)"),
    ("url='http://127.0.0.1:9/SecretPath?token=qtok'", "url='http://127.0.0.1:9/***'"),
    ("URL('http://127.0.0.1:9/SecretPath')", "URL('http://127.0.0.1:9/***')"),
    ("openai unreachable at http://a:pw-77@127.0.0.1:9/v1: Connection error.",
     "openai unreachable at http://***@127.0.0.1:9/***: Connection error."),
    ("Max retries exceeded with url: /SecretPath?token=qtok (Caused by X)", "Max retries exceeded with url: /*** (Caused by X)"),
    ("POST /v1/pickups?order_id=qtok: ReadTimeout", "POST /v1/pickups?order_id=***: ReadTimeout"),
    ("Authorization: Bearer abc123def", "Authorization: Bearer ***"),
    ("{'Authorization': 'Bearer whtok-abc123def', 'Accept': 'json'}", "{'Authorization': 'Bearer ***', 'Accept': 'json'}"),
    ("Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic ***"),
    ("sent with bearer abc123def.x", "sent with bearer ***"),
    ("token=qtok, api_key: 'abc123def', \"password\": \"hunter2\", client_secret=pw-77.",
     "token=***, api_key: '***', \"password\": \"***\", client_secret=***."),
])
def test_redact(text: str, expected: str):
    assert redact(text) == expected
    assert redact(expected) == expected, "redacting twice changes nothing"


@pytest.mark.parametrize("text", [
    "http://127.0.0.1:9", "http://127.0.0.1:9/", "ftp://files.example", "v1:issue_refund:5e1d9a", "maya@example.com",
    'File "/work/main/activities/operations.py", line 40, in raise_alert', "POST /v1/refunds: ReadTimeout",
    "max_tokens: 4096", "3.5/10 attempts", "Basic authentication failed", "Cannot connect to host 127.0.0.1:9 ssl:default",
    "escalation approval_required: refund of 118.00 waits for a human", "see README.md#usage", "",
])
def test_text_without_secrets_is_left_alone(text: str):
    assert redact(text) == text


def test_the_keys_of_providers_keep_only_their_kind():
    text = "keys sk_live_abc123def, rk_test_abc123def, sk-proj-abc123def, sk-ant-api03-abc123def, whsec_abc123def"
    assert redact(text) == "keys sk_live_***, rk_test_***, sk-proj-***, sk-ant-***, whsec_***"


@pytest.mark.parametrize("text", ["+a" * 20000, "a-" * 20000, "=a" * 20000, "a." * 20000, "a:" * 20000])
def test_a_long_line_takes_linear_time(text: str):
    """Every line the worker logs goes through redact, payloads included at DEBUG."""
    started = time.perf_counter()
    redact(text)
    assert time.perf_counter() - started < 2.0


SECRET_URL = "http://ops:pw-77@127.0.0.1:{port}/hooks/SecretPath?token=qtok"


def _assert_clean(text: str, port: int) -> None:
    assert "127.0.0.1" in text and str(port) in text, text  # where it went stays readable
    for secret in SECRETS:
        assert secret not in text, text


def test_requests_and_urllib3_errors():
    port = free_port()  # nothing listens: refused
    with pytest.raises(requests.ConnectionError) as refused:
        requests.post(SECRET_URL.format(port=port), timeout=2)
    assert "SecretPath" in str(refused.value)
    _assert_clean(redact(str(refused.value)), port)
    with pytest.raises(urllib3.exceptions.HTTPError) as raw:
        urllib3.PoolManager(retries=1).request("GET", SECRET_URL.format(port=port))
    assert "SecretPath" in str(raw.value)
    _assert_clean(redact(str(raw.value)), port)


def test_httpx_and_aiohttp_status_errors():
    port = free_port()
    url = SECRET_URL.format(port=port)
    with pytest.raises(httpx2.HTTPStatusError) as status:
        httpx2.Response(500, request=httpx2.Request("POST", url)).raise_for_status()
    assert "SecretPath" in str(status.value)
    _assert_clean(redact(str(status.value)), port)
    info = RequestInfo(URL(url), "POST", CIMultiDictProxy(CIMultiDict({"Authorization": "Bearer abc123def"})), URL(url))
    error = ClientResponseError(info, (), status=500, message="Internal Server Error")
    for text in (str(error), repr(error), repr(info)):
        assert "SecretPath" in text
        _assert_clean(redact(text), port)


async def test_aiohttp_refused_and_invalid_urls():
    port = free_port()
    async with aiohttp.ClientSession() as session:
        for url in (SECRET_URL.format(port=port), f"http://[::1]:{port}/hooks/SecretPath?token=qtok"):
            with pytest.raises(aiohttp.ClientError) as refused:
                async with session.post(url):
                    pass
            assert "SecretPath" not in redact(f"{refused.value!r} {refused.value}")
        with pytest.raises(ValueError) as invalid:
            async with session.post(f"http://:pw-77@[::1:{port}/SecretPath"):
                pass
        assert "SecretPath" not in redact(str(invalid.value)) and "pw-77" not in redact(str(invalid.value))


def _failure_text(err: BaseException) -> str:
    """What Temporal's default failure converter writes to the history for `err`, as text."""
    failure = Failure()
    DataConverter.default.failure_converter.to_failure(err, DataConverter.default.payload_converter, failure)
    return str(failure)


def _raised(make) -> BaseException:
    try:
        make()
    except BaseException as err:
        return err
    raise AssertionError("nothing raised")


def test_an_activity_error_leaves_with_its_cause_chain_redacted():
    url = SECRET_URL.format(port=9)

    def leaky_chain():
        try:
            raise OSError(f"connect to {url} refused")
        except OSError as err:
            raise ApplicationError(f"POST {url} failed", {"kept": 1}, type="Leaky",
                                   next_retry_delay=timedelta(seconds=3)) from err

    def leaky_context():
        try:
            raise ConnectionError(f"reset by {url}")
        except ConnectionError:
            raise RuntimeError(f"while posting to {url}")  # noqa: B904 (implicit context, not sent for a plain exception)

    raw = _raised(leaky_chain)
    assert "SecretPath" in _failure_text(raw), "the raw chain would leak: the test looks at the right place"
    clean = redacted_error(raw)
    text = _failure_text(clean)
    assert "SecretPath" not in text and "pw-77" not in text and "qtok" not in text
    assert "127.0.0.1:9" in text and "OSError" in text, "the cause is still there, redacted"
    assert (clean.type, clean.details, clean.next_retry_delay, clean.non_retryable) == (
        "Leaky", ({"kept": 1},), timedelta(seconds=3), False)

    plain = redacted_error(_raised(leaky_context))
    assert isinstance(plain, ApplicationError) and plain.type == "RuntimeError"
    assert "SecretPath" not in _failure_text(plain)

    def suppressed():
        try:
            raise OSError(url)
        except OSError:
            raise ApplicationError("gave up", type="X", non_retryable=True) from None

    quiet = redacted_error(_raised(suppressed))
    assert quiet.__cause__ is None and quiet.non_retryable and "SecretPath" not in _failure_text(quiet)
    cancelled = CancelledError()
    assert redacted_error(cancelled) is cancelled


@pytest.fixture
def redacting_logs():
    previous = logging.getLogRecordFactory()
    install_log_redaction()
    install_log_redaction()
    yield
    logging.setLogRecordFactory(previous)


def test_every_log_line_is_redacted_whatever_handler_writes_it(redacting_logs):
    factory = logging.getLogRecordFactory()
    install_log_redaction()
    assert logging.getLogRecordFactory() is factory, "installed once"
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)  # added after the install: its records are redacted too
    handler.setFormatter(JsonFormatter())
    plain = io.StringIO()
    plain_handler = logging.StreamHandler(plain)
    logger = logging.getLogger("some.library")
    logger.addHandler(handler)
    logger.addHandler(plain_handler)
    url = SECRET_URL.format(port=9)
    try:
        logger.warning("POST %s answered %d", url, 500)
        try:
            raise ApplicationError(f"webhook {url} failed") from OSError(f"{url} Authorization: Bearer abc123def")
        except ApplicationError:
            logger.exception("alert failed")
        logger.warning("bad %s %s", url)  # arguments that do not fit the format
    finally:
        logger.removeHandler(handler)
        logger.removeHandler(plain_handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines[0]["message"] == "POST http://***@127.0.0.1:9/*** answered 500"
    assert "Traceback" in lines[1]["error"] and "OSError" in lines[1]["error"]
    for text in (stream.getvalue(), plain.getvalue()):
        for secret in SECRETS:
            assert secret not in text, text


LEAKY_URL = "http://ops:pw-77@127.0.0.1:9/orders/SecretPath?token=qtok"


@activity.defn(name="get_order")
async def get_order_through_a_leaky_client(call: ToolInput) -> ToolResult:
    """Raises what careless code raises: a raw client error under the message, then inside a handler."""
    if activity.info().attempt == 1:
        try:
            raise ConnectionError(f"GET {LEAKY_URL} refused")
        except ConnectionError as err:
            raise RuntimeError(f"order lookup at {LEAKY_URL} failed") from err
    try:
        await asyncio.sleep(0)
        raise OSError(f"GET {LEAKY_URL}: reset")
    except OSError:
        raise ApplicationError(f"order lookup at {LEAKY_URL} failed again", type="Leaky",  # noqa: B904 (the context leaks)
                               non_retryable=True)


async def test_no_activity_failure_carries_a_url_secret_into_the_history(
    client: Client, settings: Settings, world: World, caplog,
):
    """Whatever an activity raises, the worker's interceptor sends it redacted, cause chain included;
    its types and retry flags stay (a non-retryable error ends the retries at its attempt)."""
    caplog.set_level(logging.DEBUG)
    task = scenario_task("SU-88421")
    async with running_worker(client, settings, replace=[get_order_through_a_leaky_client]):
        handle = await start(client, settings, task)

        async def failed():
            step = (await checkpoint(handle)).steps.get("get_order")
            return step if step and step.reason == "attempts_exhausted" else None
        step = await wait_for(failed, "get_order to fail for good", 60)
        await handle.terminate("test over")
    failures = [r for r in caplog.records if r.getMessage().startswith("Completing activity as failed")
                and "'activity_type': 'get_order'" in r.getMessage()]
    assert len(failures) == 2, "the non-retryable error ended the retries at its attempt"
    history = (await handle.fetch_history()).to_json()
    # A read is a local activity: its last failure, with its cause chain, is in the marker; the first
    # attempt's failure was redacted in the worker's log (checked below).
    assert '"Leaky"' in history and "OSError" in history
    assert "RuntimeError: order lookup at http://***@127.0.0.1:9/*** failed" in caplog.text
    assert "127.0.0.1:9" in history
    for where, text in (("history", history), ("checkpoint", step.model_dump_json()), ("worker log", caplog.text)):
        for secret in SECRETS:
            assert secret not in text, f"{secret} in the {where}"
