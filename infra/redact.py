"""One redaction for every text that may quote a URL or a credential: activity failures (which are
plain text in the event history when PAYLOAD_ENCRYPTION_KEY is unset), checkpoints, dead letters
and the worker's log.

HTTP clients quote the URL they failed on (aiohttp's ClientResponseError, httpx's HTTPStatusError,
urllib3's "Max retries exceeded with url: /path?query"), and a URL is often a credential itself: a
webhook's path (Slack, Discord, Teams, Zapier) or its `?token=`, a password before `@`. So a URL
keeps only what an operator needs to tell which service failed, its scheme, host and port:

    https://ops:pw@hooks.example.com:8443/services/T0/B0/XyZ?token=abc#f  ->  https://***@hooks.example.com:8443/***

Every path, query and fragment goes, not only the parts that look secret: no rule can tell a secret
path segment from a harmless one, and the host and port already say where the request went. The
path urllib3 quotes without its host ("with url: /path?query") goes too; any other bare path (a
request line such as `POST /v1/refunds?x=1`) keeps its path, not its query values.
Bearer and Basic credentials, Authorization headers, Stripe/OpenAI/Anthropic-shaped keys and
`token=`/`password=`/`api_key=`-like pairs become `***` too. `redact` is idempotent.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from temporalio.exceptions import ApplicationError, FailureError

MASK = "***"
_STOP = r"\s'\"<>`"  # what ends a URL quoted in free text
# Runs that may repeat at every position are bounded, so a long line (a payload in a DEBUG log) costs linear time.
_SCHEMED = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]{0,30}://)(?P<user>[^" + _STOP + r"/?#]*@)?"
                      r"(?P<host>[^" + _STOP + r"/?#]*)(?P<rest>[/?#][^" + _STOP + r"]*)?")  # even a malformed host
_BARE = re.compile(r"(?P<user>[^" + _STOP + r"/?#@(),;]{1,128}@)?"
                   r"(?P<host>(?:localhost|(?:\d{1,3}\.){3}\d{1,3}|\[[0-9A-Fa-f:.]+\]|(?:[A-Za-z0-9-]{1,63}\.){1,10}[A-Za-z]{2,24})"
                   r"(?::\d+)?)(?P<rest>[/?][^" + _STOP + r"]*)")  # not `#`: README.md#usage is no host
_URL_PATH = re.compile(r"(?i)(\burl:?\s*)/[^" + _STOP + r"]*")
_QUERY_VALUE = re.compile(r"([?&][A-Za-z0-9_.\[\]-]+=)(?!\*\*\*)[^&#" + _STOP + r"]+")
_AUTHORIZATION = re.compile(r"(?i)(\b(?:proxy-)?authorization['\"]?\s*[:=]\s*['\"]?)(?:(bearer|basic|token|digest)\s+)?"
                            r"[^\s'\",;}]+")
_SCHEME_TOKEN = re.compile(r"(?i)\b(bearer|basic)\s+(?=[A-Za-z]*[0-9._~+/=-])(?!\*\*\*)[A-Za-z0-9._~+/=-]{8,}")
_KEY_SHAPES = re.compile(r"\b((?:sk|rk)_(?:live|test)_|whsec_|sk-(?:proj-|ant-)?)(?!\*\*\*)[A-Za-z0-9_-]{6,}")
_SECRET_PAIR = re.compile(r"(?i)(\b[A-Za-z_-]{0,40}(?:token|secret|password|passwd|api[_-]?key)['\"]?\s*[=:]\s*['\"]?)"
                          r"(?!\*\*\*)[^\s'\",;&)}\]`]+")
_TRAILING = ".,;:!?)]}"


def redact(text: str) -> str:
    """`text` with every URL cut to scheme://host:port and every credential-shaped value masked."""
    text = _SCHEMED.sub(_url, text)
    text = _BARE.sub(_url, text)
    text = _URL_PATH.sub(lambda m: m.group(1) + "/" + MASK, text)
    text = _QUERY_VALUE.sub(_value, text)
    text = _AUTHORIZATION.sub(lambda m: m.group(1) + (m.group(2) + " " if m.group(2) else "") + MASK, text)
    text = _SCHEME_TOKEN.sub(r"\1 " + MASK, text)
    text = _KEY_SHAPES.sub(r"\1" + MASK, text)
    return _SECRET_PAIR.sub(_value, text)


def _split(text: str) -> tuple[str, str]:
    """`text` without the punctuation that ends it, and that punctuation: a sentence's full stop, a
    closing bracket or a colon after a quoted URL stays in the message."""
    kept = len(text) - len(text.rstrip(_TRAILING))
    return (text[:-kept], text[-kept:]) if kept else (text, "")


def _value(match: re.Match[str]) -> str:
    return match.group(1) + MASK + _split(match.group(0)[len(match.group(1)):])[1]


def _url(match: re.Match[str]) -> str:
    rest, tail = _split(match.group("rest") or "")
    scheme = match.groupdict().get("scheme") or ""
    user = MASK + "@" if match.group("user") else ""
    path = "/" + MASK if rest not in ("", "/", "/" + MASK) else rest
    return f"{scheme}{user}{match.group('host')}{path}{tail}"


class RedactingFilter(logging.Filter):
    """Redacts a record's message with its arguments merged in, its exception text and its stack.

    The exception is rendered to text here (`exc_text`) and `exc_info` dropped, so no formatter can
    render the raw exception again."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # arguments that do not fit the format: keep both, as text
            message = f"{record.msg} {record.args!r}"
        record.msg, record.args = redact(message), None
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def install_log_redaction() -> None:
    """Run `RedactingFilter` on every log record this process creates, once.

    Through the record factory rather than on handlers or loggers: a handler's filter misses the
    handlers added after it (a log shipper's, pytest's), and a logger's filter misses what its
    children propagate, while every record of every library (temporalio's, the Rust core's, aiohttp's)
    is made by the factory."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "redacts", False):
        return
    redacting = RedactingFilter()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        redacting.filter(record)
        return record

    factory.redacts = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def redacted_error(err: BaseException) -> BaseException:
    """The error an activity may raise out to Temporal: its message and its whole cause chain redacted.

    Temporal serializes the cause chain into the failure, so a redacted message over a raw cause (a
    `raise ... from err`) would still leak. The chain is the one Temporal's converter would send: an
    ApplicationError's `__cause__`, else its unsuppressed `__context__`; another exception's
    `__cause__` only. An ApplicationError keeps its type, details, retry flags and delay; any other
    exception becomes the ApplicationError Temporal would have made of it (type = class name). Other
    Temporal failures (cancellation) are returned unchanged."""
    if isinstance(err, ApplicationError):
        clean = ApplicationError(redact(err.message), *err.details, type=err.type, non_retryable=err.non_retryable,
                                 next_retry_delay=err.next_retry_delay, category=err.category)
        cause = err.__cause__ if err.__cause__ is not None or err.__suppress_context__ else err.__context__
    elif isinstance(err, FailureError):
        return err
    else:
        clean = ApplicationError(redact(str(err)), type=type(err).__name__)
        cause = err.__cause__
    clean.__traceback__ = err.__traceback__
    clean.__cause__ = redacted_error(cause) if cause is not None else None
    clean.__suppress_context__ = True
    return clean
