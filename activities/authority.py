"""Authority held by the worker: each task's policy, and the check of a decision's signature.

The approvers' public keys, the ceilings, the escalation deadline and the kinds' tools are the
worker's configuration (infra/settings.py). The workflow asks for them once (`task_policy`,
recorded in its history) and sends each decision that could apply here (`verify_decision`), so
no key ever enters workflow code. Signing lives here too, for `starter.py keygen` and `sign`.
"""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from temporalio import activity

from activities.db import Database
from activities.records import Records
from core.authority import parse_time, signed_message
from core.kinds import KINDS
from core.models import Policy, PolicyInput, ResolveInput, Verdict, VerifyInput


class AuthorityActivities:
    """`approvers` maps each approver's name to their Ed25519 public key."""

    def __init__(self, db: Database, approvers: dict[str, Ed25519PublicKey], refund_ceiling_cents: int,
                 payment_ceiling_cents: int | None, escalation_timeout_seconds: int,
                 disabled_tools: frozenset[str] = frozenset()) -> None:
        self._records = Records(db)
        self._approvers = approvers
        self._refund_ceiling = refund_ceiling_cents
        self._payment_ceiling = payment_ceiling_cents
        self._escalation_timeout = escalation_timeout_seconds
        self._disabled = disabled_tools

    def activities(self) -> list:
        return [self.task_policy, self.verify_decision]

    @activity.defn(name="task_policy")
    async def task_policy(self, request: PolicyInput) -> Policy:
        """This deployment's authority over a task of this kind, with the parties on its records."""
        return Policy(
            kind=request.kind, tools=[t for t in KINDS[request.kind].tools if t not in self._disabled],
            approvers=sorted(self._approvers), refund_ceiling_cents=self._refund_ceiling,
            payment_ceiling_cents=self._payment_ceiling, escalation_timeout_seconds=self._escalation_timeout,
            parties=await asyncio.to_thread(self._parties, request.facts))

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
        """Is the decision signed by the key of the approver it names, and not expired?"""
        decision = request.decision
        key = self._approvers.get(decision.decided_by)
        if key is None:
            return Verdict(valid=False, why=f"{decision.decided_by[:80]!r} is not an approver on this worker")
        expires = parse_time(decision.expires_at)
        if expires is None or expires <= datetime.now(timezone.utc):
            return Verdict(valid=False, why=f"expired at {decision.expires_at[:40]}")
        try:
            key.verify(base64.b64decode(decision.signature, validate=True), signed_message(decision))
        except (InvalidSignature, ValueError):
            return Verdict(valid=False, why=f"the signature is not {decision.decided_by[:80]}'s over this decision")
        return Verdict(valid=True)


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
    moment = (now or datetime.now(timezone.utc)) + valid_for
    unsigned = decision.model_copy(update={"expires_at": moment.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                           "nonce": secrets.token_hex(16), "signature": ""})
    signature = base64.b64encode(key.sign(signed_message(unsigned))).decode()
    return unsigned.model_copy(update={"signature": signature})
