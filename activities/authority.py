"""Authority held by the worker: each task's policy, and the check of a decision's signature.

The approvers' public keys, the ceilings, the escalation deadline and the kinds' tools are the
worker's configuration (infra/settings.py). The workflow asks for them once (`task_policy`,
recorded in its history) and sends each decision that could apply here (`verify_decision`), so
no key ever enters workflow code. Signing lives here too, for `starter.py keygen` and `sign`.

`verify_decision` answers for this worker's configuration at the moment it runs: the approvers'
keys it holds now, and how long a decision may live (DECISION_MAX_LIFETIME_SECONDS: the signer
chooses `expires_at`, the worker caps it). A decision that verifies spends its nonce in the ledger's
database (`decision_nonces`), with the activity that verified it (workflow id, run id, activity
id): the same decision verifies again only as a Temporal retry of that same activity (on whichever
worker), never in another verification of the run, another run of the task (a redrive or a reset
starts one under the same workflow id) or another task. The workflow's own list of used nonces
(`screen`) stays: it refuses a replay within the run without an activity.
"""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from temporalio import activity

from activities.db import Database
from activities.operations import mark_redriven
from activities.records import Records
from core.authority import Ceilings, parse_time, signed_message
from core.kinds import KINDS
from core.models import Policy, PolicyInput, ResolveInput, Verdict, VerifyInput

DEFAULT_DECISION_LIFETIME_SECONDS = 4 * 3600
NONCE_PRUNE_AFTER_SECONDS = 3600  # past a decision's expiry: it is refused as expired by then, whatever the clocks


@dataclass(frozen=True)
class Deployment:
    """The deployment's authority over its tasks: who may decide (each approver's name and Ed25519 public
    key), the ceilings above which a person approves, how long a task waits for one, the tools no task is
    offered, and the longest a signed decision may live, whatever its signer wrote."""

    approvers: dict[str, Ed25519PublicKey]
    ceilings: Ceilings
    escalation_timeout_seconds: int
    disabled_tools: frozenset[str] = frozenset()
    decision_max_lifetime_seconds: int = DEFAULT_DECISION_LIFETIME_SECONDS


class AuthorityActivities:
    def __init__(self, db: Database, deployment: Deployment) -> None:
        self._records = Records(db)
        self._nonces = DecisionNonces(db)
        self._max_lifetime = timedelta(seconds=deployment.decision_max_lifetime_seconds)
        self._approvers = deployment.approvers
        self._refund_ceiling = deployment.ceilings.refund_cents
        self._payment_ceiling = deployment.ceilings.payment_cents
        self._escalation_timeout = deployment.escalation_timeout_seconds
        self._disabled = deployment.disabled_tools

    def activities(self) -> list[Callable[..., Any]]:
        return [self.task_policy, self.verify_decision]

    @activity.defn(name="task_policy")
    async def task_policy(self, request: PolicyInput) -> Policy:
        """This deployment's authority over a task of this kind, with the parties on its records. A redrive's
        first read marks the dead letter it starts again as redriven (the starter never writes the ledger)."""
        if request.redrive_of:
            await asyncio.to_thread(mark_redriven, self._records.db, request.task_id)
        return Policy(
            kind=request.kind, tools=[t for t in KINDS[request.kind].tools if t not in self._disabled],
            approvers=sorted(self._approvers), refund_ceiling_cents=self._refund_ceiling,
            payment_ceiling_cents=self._payment_ceiling, escalation_timeout_seconds=self._escalation_timeout,
            parties=await asyncio.to_thread(self._parties, request.facts),
            approver_keys={name: public_key_text(key) for name, key in sorted(self._approvers.items())})

    def _parties(self, facts: dict[str, str]) -> list[str]:
        parties = []
        order = self._records.order(facts["order_id"]) if "order_id" in facts else None
        if order is not None:
            parties += [order.order.customer_email, order.order.seller_email]
        invoice = self._records.invoice(facts["invoice_id"]) if "invoice_id" in facts else None
        if invoice is not None:
            parties.append(invoice.invoice.payee_email)
        return sorted({p.lower() for p in parties})

    @activity.defn(name="verify_decision")
    async def verify_decision(self, request: VerifyInput) -> Verdict:
        """Is the decision signed by the key this worker now holds for the approver it names, alive
        and not longer than this worker allows, and not used in another verification?"""
        decision = request.decision
        key = self._approvers.get(decision.decided_by)
        if key is None:
            return Verdict(valid=False, why=f"{decision.decided_by[:80]!r} is not an approver on this worker")
        expires = parse_time(decision.expires_at)
        now = datetime.now(UTC)
        if expires is None or expires <= now:
            return Verdict(valid=False, why=f"expired at {decision.expires_at[:40]}")
        if expires > now + self._max_lifetime:
            return Verdict(valid=False, why=f"expires at {decision.expires_at[:40]}: this worker accepts decisions "
                                            f"valid for at most {_duration(self._max_lifetime)} "
                                            "(DECISION_MAX_LIFETIME_SECONDS); sign it again with a shorter lifetime")
        if not decision.nonce:
            return Verdict(valid=False, why="no nonce: a decision needs one to be used once (starter.py sign)")
        try:
            key.verify(base64.b64decode(decision.signature, validate=True), signed_message(decision))
        except (InvalidSignature, ValueError):
            return Verdict(valid=False, why=f"the signature is not {decision.decided_by[:80]}'s over this decision")
        info = activity.info()
        used = await asyncio.to_thread(self._nonces.use, decision, expires,
                                       f"{info.workflow_id}/{info.workflow_run_id}/{info.activity_id}")
        return Verdict(valid=False, why=used) if used else Verdict(valid=True)


class DecisionNonces:
    """The nonces of decisions that verified, in the ledger's database (table `decision_nonces`)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def use(self, decision: ResolveInput, expires: datetime, seen_by: str) -> str | None:
        """Spend the decision's nonce for the verification `seen_by` (workflow/run/activity id):
        None when it is this verification's (first seen now, or by an earlier attempt of it), else why not."""
        now = time.time()
        with self._db.connect() as conn:
            conn.execute("DELETE FROM decision_nonces WHERE expires_at < :before",
                         {"before": now - NONCE_PRUNE_AFTER_SECONDS})
            conn.execute(
                "INSERT INTO decision_nonces (nonce, task_id, intent_key, decided_by, first_seen_by, expires_at,"
                " created_at) VALUES (:nonce, :task, :key, :by, :seen, :expires, :now) ON CONFLICT (nonce) DO NOTHING",
                {"nonce": decision.nonce, "task": decision.task_id, "key": decision.intent_key,
                 "by": decision.decided_by, "seen": seen_by, "expires": expires.timestamp(), "now": now})
            first = conn.execute("SELECT first_seen_by, created_at FROM decision_nonces WHERE nonce = :nonce",
                                 {"nonce": decision.nonce}).fetchone()
        if first is not None and first["first_seen_by"] == seen_by:
            return None
        if first is None:  # cannot be (the row was just written or was there): refuse rather than guess
            return "the decision's nonce could not be recorded; send it again"
        when = datetime.fromtimestamp(first["created_at"], UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return (f"this decision was used already: verified at {when} in {first['first_seen_by'][:300]}; "
                "a new decision needs a new signature")


def decision_nonces(db: Database, task_id: str | None = None) -> list[dict[str, Any]]:
    """The spent nonces (of one task, or all), oldest first."""
    sql = "SELECT nonce, task_id, intent_key, decided_by, first_seen_by, expires_at, created_at FROM decision_nonces"
    with db.connect() as conn:
        rows = conn.execute(sql + (" WHERE task_id = :task" if task_id is not None else "") + " ORDER BY created_at",
                            {"task": task_id}).fetchall()
    return [dict(r) for r in rows]


def _duration(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


# --- keys and signing (the approver's side) --------------------------------------------------

def public_key_from(text: str) -> Ed25519PublicKey:
    """A public key from its base64 text (the 32 raw bytes); ValueError if it is not one."""
    try:
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(text, validate=True))
    except ValueError as err:
        raise ValueError(f"not an Ed25519 public key (base64 of 32 bytes): {text[:16]}...") from err


def public_key_text(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return base64.b64encode(public.public_bytes(serialization.Encoding.Raw,
                                                serialization.PublicFormat.Raw)).decode()


def new_key_file(path: Path) -> Ed25519PrivateKey:
    """Write a new private key (PEM, readable by its owner only); refuse to overwrite one."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    return key


def load_key_file(path: Path) -> Ed25519PrivateKey:
    """The approver's private key; ValueError if the file is not an Ed25519 PEM key."""
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"cannot read an Ed25519 private key from {path}: {str(err).splitlines()[0]}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def sign(decision: ResolveInput, key: Ed25519PrivateKey, valid_for: timedelta = timedelta(hours=1),
         now: datetime | None = None) -> ResolveInput:
    """The decision with an expiry, a fresh nonce and the approver's signature over all of it."""
    moment = (now or datetime.now(UTC)) + valid_for
    unsigned = decision.model_copy(update={"expires_at": moment.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                           "nonce": secrets.token_hex(16), "signature": ""})
    signature = base64.b64encode(key.sign(signed_message(unsigned))).decode()
    return unsigned.model_copy(update={"signature": signature})
