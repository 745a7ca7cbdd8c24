"""The approvers the tests' workers trust, and signing decisions as they would."""

from __future__ import annotations

from datetime import timedelta

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from activities.authority import public_key_text, sign
from core.models import Escalation, ResolveInput

ALICE = "alice@example.com"
ALICE_KEY = Ed25519PrivateKey.generate()
BOB = "bob@example.com"
BOB_KEY = Ed25519PrivateKey.generate()
APPROVERS = f"{ALICE}={public_key_text(ALICE_KEY)},{BOB}={public_key_text(BOB_KEY)}"


def signed(task_id: str, key: str | Escalation, decision: str, by: str = ALICE,
           signer: Ed25519PrivateKey | None = None, valid_for: timedelta = timedelta(minutes=30), note: str = "checked",
           question: int | None = 1, **extra) -> dict:
    """A decision signed by `signer` (the named approver's own key by default), as the signal's JSON.
    `key` is the call's intent key, answering the task's first question unless `question` says which
    (None: none, as before questions were numbered), or the question itself (a checkpoint's waiting_for)."""
    if isinstance(key, Escalation):
        key, question = key.intent_key, key.question or None
    private = signer or {ALICE: ALICE_KEY, BOB: BOB_KEY}.get(by, ALICE_KEY)
    unsigned = ResolveInput(task_id=task_id, intent_key=key, decision=decision, decided_by=by, note=note,
                            question=question, **extra)
    return sign(unsigned, private, valid_for).model_dump(mode="json")
