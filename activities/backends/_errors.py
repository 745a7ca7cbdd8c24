"""How a provider's answer becomes a Temporal activity failure.

The SDKs' own retries are off (`max_retries=0`): each activity attempt is one HTTP request, and
Temporal retries the activity with `MODEL_POLICY`. A failure is raised as one of::

    ModelConfigError (ValueError)        at worker start, never inside an activity: unknown backend,
                                         missing API key or model name
    ApplicationError, retryable
      type ModelRateLimited              429; next_retry_delay from Retry-After (or retry-after-ms)
      type ModelUnavailable              408, 409, 5xx (Anthropic's 529 overloaded), connection
                                         errors, timeouts; next_retry_delay from Retry-After if sent
      type ModelReplyUnusable            a 200 whose body holds no message to read
    ApplicationError, non_retryable      no retry: the workflow dead-letters the task at once
      type ModelRequestRejected          401, 403 (credentials), 400, 404, 422 and any other 4xx

Malformed tool-call arguments are not a failure here: they go back to the workflow as raw text,
and its gate answers them with a structured `not_performed` on the next turn.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Protocol

from temporalio.exceptions import ApplicationError

from infra.redact import redact

RATE_LIMITED = "ModelRateLimited"
UNAVAILABLE = "ModelUnavailable"
UNUSABLE = "ModelReplyUnusable"
REJECTED = "ModelRequestRejected"

_RETRYABLE_STATUS = frozenset({408, 409, 429})
_MAX_RETRY_AFTER = timedelta(minutes=10)
_MESSAGE_CHARS = 300


class ModelConfigError(ValueError):
    """A model backend that cannot start: the worker prints it on one line and exits 2."""


def retry_after(headers: Mapping[str, str] | None) -> timedelta | None:
    """The delay a `Retry-After` (seconds or HTTP date) or `retry-after-ms` header asks for."""
    if not headers:
        return None
    delay: float | None = None
    millis = headers.get("retry-after-ms")
    value = headers.get("retry-after")
    if millis:
        delay = _number(millis)
        delay = None if delay is None else delay / 1000
    if delay is None and value:
        delay = _number(value)
        if delay is None:
            parsed = email.utils.parsedate_tz(value)
            delay = None if parsed is None else email.utils.mktime_tz(parsed) - time.time()
    if delay is None or not math.isfinite(delay) or delay <= 0:
        return None
    return min(timedelta(seconds=delay), _MAX_RETRY_AFTER)


class _Response(Protocol):
    @property
    def headers(self) -> Mapping[str, str]: ...


class StatusError(Protocol):
    """An SDK's error for an HTTP error answer (openai.APIStatusError, anthropic.APIStatusError)."""

    @property
    def status_code(self) -> int: ...
    @property
    def response(self) -> _Response: ...
    @property
    def body(self) -> object: ...
    @property
    def message(self) -> str: ...


def status_failure(provider: str, err: StatusError, *, secret: str, key_variable: str) -> ApplicationError:
    """The ApplicationError for an HTTP error answer from the provider."""
    status, headers = err.status_code, err.response.headers
    detail = _scrub(_body_message(err.body) or err.message, secret)
    if status == 429:
        return ApplicationError(f"{provider} rate limit (429): {detail}", type=RATE_LIMITED,
                                next_retry_delay=retry_after(headers))
    if status >= 500 or status in _RETRYABLE_STATUS:
        return ApplicationError(f"{provider} unavailable ({status}): {detail}", type=UNAVAILABLE,
                                next_retry_delay=retry_after(headers))
    if status in (401, 403):
        hint = f"check {key_variable}"
    elif status == 404:
        hint = "check MODEL_NAME and the base URL"
    else:
        hint = "the request was invalid; retrying it would not help"
    return ApplicationError(f"{provider} rejected the request ({status}): {detail} ({hint})",
                            type=REJECTED, non_retryable=True)


def connection_failure(provider: str, where: str, err: BaseException, *, secret: str) -> ApplicationError:
    """The ApplicationError for a request that got no HTTP answer (refused, reset, timed out)."""
    cause = err.__cause__ or err
    detail = str(err) if cause is err else f"{err} ({type(cause).__name__})"
    return ApplicationError(_scrub(f"{provider} unreachable at {where}: {detail}", secret), type=UNAVAILABLE)


def unusable(provider: str, why: str) -> ApplicationError:
    return ApplicationError(f"{provider} reply unusable: {why}", type=UNUSABLE)


def _body_message(body: object) -> str | None:
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, Mapping) else inner
        return str(message)[:_MESSAGE_CHARS] if message else None
    if isinstance(body, str) and body.strip():
        return body.strip()[:_MESSAGE_CHARS]
    return None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _scrub(text: str, secret: str) -> str:
    """Never let the API key, a URL's password, path or query (infra/redact.py) reach an event history,
    a log or a dead letter, even echoed in a provider's message."""
    return redact(text.replace(secret, "***") if secret else text)
