"""Set the Stripe edge's mode and fault rules from tests, the starter and the demo."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

FAULT_PRESETS = ("timeout-after-accept", "error-after-commit", "drop-after-commit", "error-before-commit",
                 "drop-before-commit", "conflict-before-commit", "unverifiable")


class EdgeControl:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def configure(self, mode: str = "dedupe", rules: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return self._call("PUT", "/_edge/config", {"mode": mode, "rules": rules or []})

    def current(self) -> dict[str, Any]:
        """The edge's configuration now (mode, rules, seed), to put back with `restore`."""
        return self._call("GET", "/_edge/config")

    def restore(self, config: dict[str, Any]) -> None:
        self._call("PUT", "/_edge/config", config)

    def stats(self) -> dict[str, int]:
        return self._call("GET", "/_edge/stats")

    def marked(self) -> list[dict[str, Any]]:
        """The requests that rules with a label fired on (their metadata's task_id and intent_key)."""
        return self._call("GET", "/_edge/marked")

    def fail_refund(self, refund_id: str, status: str = "failed") -> dict[str, Any]:
        """The provider fails a refund it made, as Stripe does when the card can no longer take it."""
        return self._call("POST", "/_edge/fail_refund", {"id": refund_id, "status": status})

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())


def preset(name: str, path: str, client_timeout: float) -> list[dict[str, Any]]:
    """Rules for a named fault on the first POST to `path` (the money endpoint of a scenario).

    `unverifiable` is a timeout after accept whose every later lookup fails as well.
    """
    late = client_timeout + 1.0
    first = {"method": "POST", "path": path, "nth": [1]}
    if name == "unverifiable":
        lookup = "/v1/refunds" if path == "/v1/refunds" else "/v1/payment_intents"
        return [{**first, "fault": "timeout_after_accept", "delay_seconds": late},
                {"method": "GET", "path": lookup, "fault": "fail", "after_rule": 0}]
    fault = name.replace("-", "_")
    return [{**first, "fault": fault, "delay_seconds": late if fault == "timeout_after_accept" else 0.0}]
