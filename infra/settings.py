"""Configuration from the environment, read at the entry points and inside activities.

Secrets (the Stripe key) are read here by the worker only; they never enter workflow or
activity inputs, so they never reach an event history. The model providers' keys and base URLs
(OPENAI_API_KEY, OPENAI_BASE_URL, ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL) are not settings: the
model backend reads them from the environment itself (activities/backends/).
"""

from __future__ import annotations

import base64
import os
import sys
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.names import DEFAULT_TASK_QUEUE

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="", extra="ignore", env_ignore_empty=True)

    # Where Temporal is: see infra/connection.py (TEMPORAL_* variables and profiles, read by temporalio.envconfig).
    temporal_address: str | None = None
    temporal_namespace: str | None = None
    payload_encryption_key: SecretStr | None = Field(default=None, description="base64 of 32 bytes; see infra/codec.py")
    payload_compression: bool = Field(default=True, description="with the key: compress payloads before they are"
                                      " encrypted, where that makes them shorter (docs/security.md)")
    metrics_port: int = Field(default=0, ge=0, le=65535, description="Prometheus endpoint on 127.0.0.1; 0 is off")
    otel_tracing: bool = False
    task_queue: str = DEFAULT_TASK_QUEUE
    stripe_api_key: SecretStr = SecretStr("sk_test_local")
    stripe_api_base: str = "http://127.0.0.1:8420"
    stripe_timeout_seconds: float = Field(default=5.0, gt=0)
    stripe_sdk_retries: int = Field(default=2, ge=0, le=5)
    stripe_honours_keys: bool = Field(default=False, description="the provider dedupes by idempotency key (Stripe"
                                      " does); false is the safe default: an ambiguous send waits out its horizon")
    stripe_processing_window_seconds: float = Field(default=30.0, ge=0, description="how long after the client gave"
                                                    " up a request may still land at the provider")
    effect_lease_seconds: float = Field(default=5.0, gt=0, description="how long after its claim an attempt may"
                                        " still start its request")
    agent_db_path: Path = PROJECT_ROOT / ".local" / "agent.db"
    database_url: SecretStr | None = Field(default=None, description="postgresql+psycopg://...; SQLite file if unset")
    approval_ceiling_cents: int = Field(default=15000, ge=0, description="refunds of a task, an item or an order"
                                        " above this in total wait for a human")
    payment_approval_ceiling_cents: int | None = Field(default=None, ge=0, description="supplier payments above"
                                                       " this wait for a human; unset: no ceiling")
    model_backend: Literal["scripted", "openai", "anthropic"] = "scripted"
    model_name: str | None = Field(default=None, description="the provider's model id; required unless scripted")
    model_timeout_seconds: float = Field(default=100.0, gt=0, le=115, description="one request; under the "
                                         "model_turn activity's 120 s start-to-close")
    model_max_tokens: int = Field(default=4096, gt=0, description="reply token limit (sent to Anthropic)")
    temporal_ui_url: str = "http://127.0.0.1:8233"
    alert_webhook_url: str | None = None
    alert_webhook_token: SecretStr | None = None
    escalation_timeout_seconds: int = Field(default=24 * 3600, gt=0)
    approvers: str = Field(default="", description="name=public key (base64), comma-separated; "
                           "`starter.py keygen` prints one. Empty: nobody may decide")
    decision_max_lifetime_seconds: int = Field(default=4 * 3600, gt=0, description="the longest a signed decision"
                                               " may be valid (its signer sets expires_at): one expiring later is"
                                               " refused")
    messages_per_recipient: int = Field(default=3, ge=1, description="messages one task may send to any one"
                                        " recipient; one more is not sent (activities/records.py send_once)")
    messages_per_task: int = Field(default=6, ge=1, description="messages one task may send in all")
    disabled_tools: str = Field(default="", description="comma-separated tools no task of this worker gets")
    unreadable_reads_before_asking: int = Field(default=6, ge=1, description="reads of a provider that cannot be"
                                                " read (1, 2, 4, 8, 16 s apart) before a person is asked about an"
                                                " intent it may hold; 1 asks at the first")
    reconcile_every_minutes: float = Field(default=5, ge=0, description="0 turns the reconciliation schedule off")
    # Admission control (worker.py `worker_tuner`, docs/scale.md): how many tasks of each kind the worker
    # takes from Temporal at once. A task it has not taken waits in the task queue, where waiting is free;
    # one it has taken counts against its timeouts, so the worker takes only what it can start now.
    worker_tuner: Literal["fixed", "resource"] = Field(default="fixed", description="fixed: at most the slots"
                                                       " below; resource: the SDK's resource-based tuner between"
                                                       " one per core and the slots below, holding the machine"
                                                       " at WORKER_TARGET_CPU")
    worker_activity_slots: int | None = Field(default=None, ge=1, description="activity attempts running at"
                                              " once; unset: 8 per core")
    # The SDK runs each workflow activation on a thread of its own, one per slot in use (its 2 s deadlock
    # timer counts a wait for a thread too, so none waits). Activations are pure Python and share one GIL:
    # more slots than a few per core add threads the event loop (activity starts, completions, polls)
    # waits behind, not speed.
    worker_workflow_slots: int | None = Field(default=None, ge=2, description="workflow tasks at once, each on"
                                              " its own thread; unset: 2 per core")
    worker_local_activity_slots: int | None = Field(default=None, ge=1, description="local activities at"
                                                    " once; unset: 8 per core")
    worker_target_cpu: float = Field(default=0.8, gt=0, le=1, description="resource tuner: the machine's CPU"
                                     " use above which no slot is added")
    worker_target_memory: float = Field(default=0.8, gt=0, le=1, description="resource tuner: the same for"
                                        " memory")
    # A workflow task waits this long on the sticky queue of the worker that holds its run before it goes
    # to the shared queue, where another worker (or the same) replays the whole history. Longer than the
    # backlog a busy worker's queue holds; it is what a task on a dead worker's sticky queue waits.
    worker_sticky_timeout_seconds: float = Field(default=10, gt=0, description="how long a workflow task"
                                                 " waits for the worker that holds its run (sticky queue)")
    # A run the worker keeps in memory between its workflow tasks; one evicted to make room is replayed
    # from its whole history (in a fresh sandbox) on its next task. More tasks in flight than this, and
    # every task turns into replays: a 4,200-ticket burst on the SDK's 1,000 ran at half the speed.
    # A process beside the worker that keeps its running attempts alive while the worker cannot (a long
    # garbage collection holds every thread of it) and fails them at once when the worker dies
    # (infra/liveness.py).
    worker_liveness_keeper: bool = Field(default=True, description="start the liveness keeper beside the worker")
    worker_cached_workflows: int = Field(default=5000, ge=0, description="workflow runs kept in memory"
                                         " between their tasks (about 200 KB each); 0: replay every task")

    @property
    def database(self) -> str:
        """Where the ledger lives: DATABASE_URL, else the SQLite file at AGENT_DB_PATH."""
        return self.database_url.get_secret_value() if self.database_url else str(self.agent_db_path)

    @field_validator("approvers")
    @classmethod
    def _approvers_have_keys(cls, value: str) -> str:
        for entry in filter(None, (e.strip() for e in value.split(","))):
            name, _, key = entry.partition("=")
            if not name.strip() or not key.strip():
                raise ValueError(f"{entry[:40]!r} is not name=public-key")
            try:
                raw = base64.b64decode(key.strip(), validate=True)
            except ValueError:
                raw = b""
            if len(raw) != 32:
                raise ValueError(f"the key of {name.strip()[:40]!r} is not an Ed25519 public key (base64, 32 bytes)")
        return value

    @property
    def approver_keys(self) -> dict[str, str]:
        """Each approver's name and public key (base64 of the 32 raw Ed25519 bytes)."""
        pairs = (e.strip().partition("=") for e in self.approvers.split(",") if e.strip())
        return {name.strip(): key.strip() for name, _, key in pairs}

    @property
    def slots(self) -> tuple[int, int, int]:
        """Workflow, activity and local activity slots: as set, else 2 (workflow tasks) or 8 per core this
        process may use."""
        per_core = 8 * cores()
        return (self.worker_workflow_slots or 2 * cores(), self.worker_activity_slots or per_core,
                self.worker_local_activity_slots or per_core)

    @property
    def disabled_tool_set(self) -> frozenset[str]:
        return frozenset(t.strip() for t in self.disabled_tools.split(",") if t.strip())


def cores() -> int:
    """The CPU cores this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def load_settings() -> Settings:
    """Settings, or one line on stderr and exit 2 for a configuration mistake."""
    try:
        return Settings()
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]).upper()
        print(f"configuration error: {field}: {first['msg']}", file=sys.stderr)
        raise SystemExit(2) from None
