"""Metrics, structured logs and tracing for the worker.

- Metrics: the Temporal SDK's own (task latencies, slots, polls) and ours (`agent_tool_outcomes`,
  `agent_escalations`, `agent_dead_letters`), recorded through the SDK's meter and served together
  on one Prometheus endpoint, http://127.0.0.1:METRICS_PORT/metrics.
- Logs: one JSON object per line, carrying task id, tool and intent key where there is one; every
  line redacted (URL paths and queries, credentials: infra/redact.py).
- Tracing: OpenTelemetry spans for workflows and activities through temporalio's contrib
  interceptor, off unless OTEL_TRACING=1 (an OTLP exporter is configured by the usual
  OTEL_EXPORTER_OTLP_* variables when opentelemetry-exporter-otlp is installed).
"""

from __future__ import annotations

import gc
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from temporalio.client import Interceptor
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    PrometheusConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)

from infra.redact import install_log_redaction

_FIELDS = ("task_id", "tool", "intent_key", "outcome", "reason", "attempt")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
                                "message": record.getMessage()}
        line.update({k: getattr(record, k) for k in _FIELDS if getattr(record, k, None) is not None})
        for key in ("temporal_workflow", "temporal_activity"):
            details = getattr(record, key, None)
            if isinstance(details, dict):
                line.setdefault("task_id", details.get("workflow_id"))
                line[key.removeprefix("temporal_")] = {k: v for k, v in details.items()
                                                       if k in ("workflow_type", "run_id", "activity_type",
                                                                "attempt")}
        if record.exc_text:  # rendered and redacted already (infra/redact.py)
            line["error"] = record.exc_text
        elif record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def setup_logging(level: str = "INFO") -> None:
    """Every line the worker writes is JSON: our logs, the SDK's, Python warnings and the Rust core's (see runtime),
    each redacted (infra/redact.py)."""
    install_log_redaction()
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.captureWarnings(True)
    # The stripe SDK logs two or three lines at INFO for every request it makes ("Request to Stripe api",
    # "Stripe API response", its errors): in `make week` three quarters of the worker's lines, each about
    # 50 us of the worker's CPU to format. Each tool call logs its outcome and reason, and a failed attempt
    # its error (activities/interceptors.py, the SDK); STRIPE_LOG=info has the SDK print its lines to stderr.
    logging.getLogger("stripe").setLevel(logging.WARNING)


# A collection that holds the GIL this long stops every thread of the worker, the heartbeat pump's too.
GC_PAUSE_SAID = 0.2


def watch_gc_pauses(longer_than: float = GC_PAUSE_SAID) -> Callable[[str, dict[str, int]], None]:
    """Log each garbage collection that held the process longer than `longer_than` seconds: nothing else
    of the worker runs meanwhile (heartbeats, activity starts), so a long one can time live attempts out."""
    began: list[float] = []
    log = logging.getLogger("worker.gc")

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[:] = [time.perf_counter(), time.thread_time()]
        elif began and (held := time.perf_counter() - began[0]) > longer_than:
            # Its own CPU beside the wall time: the rest is the machine's other processes running meanwhile.
            log.warning("garbage collection held the worker %.2f s (%.2f s of CPU; generation %d, %d objects freed)",
                        held, time.thread_time() - began[1], info["generation"], info["collected"])
    gc.callbacks.append(watch)
    return watch


def runtime(metrics_port: int) -> Runtime:
    """The worker's Temporal runtime: the Rust core's log lines go through Python logging (so they are JSON
    too, instead of plain text on stderr), and metrics go to Prometheus on 127.0.0.1 unless the port is 0."""
    logs = LoggingConfig(filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
                         forwarding=LogForwardingConfig(logger=logging.getLogger("temporalio.core")))
    metrics = PrometheusConfig(bind_address=f"127.0.0.1:{metrics_port}") if metrics_port else None
    return Runtime(telemetry=TelemetryConfig(logging=logs, metrics=metrics))


def tracing_interceptors(enabled: bool) -> list[Interceptor]:
    if not enabled:
        return []
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from temporalio.contrib.opentelemetry import TracingInterceptor

    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())
    return [TracingInterceptor()]
