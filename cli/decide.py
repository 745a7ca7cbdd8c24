"""`resolve`, `sign` and `keygen`: a person's signed decision on the call a task waits for."""

from __future__ import annotations

import argparse
import json
import os
import sys
import typing
from datetime import timedelta
from pathlib import Path

from pydantic import ValidationError
from temporalio.client import Client

from activities.authority import load_key_file, new_key_file, public_key_text, sign
from client import ClientError, checkpoint_of, connect, decide
from core.models import Decision, ResolveInput
from infra.settings import Settings

# `make up` records the local stack's approver here (devstack/stack.py); the starter only reads it.
LOCAL_STACK_STATE = Path(__file__).resolve().parent.parent / ".local" / "stack.json"


def _approver(args: argparse.Namespace) -> tuple[str, Path]:
    """--by and --key-file, else APPROVER and APPROVER_KEY_FILE, else the local stack's own approver."""
    local: dict[str, str] = {}
    try:
        local = json.loads(LOCAL_STACK_STATE.read_text()).get("env", {})
    except (OSError, ValueError):
        pass
    by = args.by or os.environ.get("APPROVER") or local.get("APPROVER")
    key_file = args.key_file or os.environ.get("APPROVER_KEY_FILE") or local.get("APPROVER_KEY_FILE")
    if not by or not by.strip():
        raise ClientError("who decides? --by NAME (as in the worker's APPROVERS), or set APPROVER")
    if not key_file:
        raise ClientError("--key-file FILE (the approver's private key, from `starter.py keygen`), "
                          "or set APPROVER_KEY_FILE")
    path = Path(key_file).expanduser()
    if not path.is_file():
        raise ClientError(f"--key-file {path}: not a file (the approver's private key, from `starter.py keygen`)")
    return by.strip(), path


async def signed_decision(args: argparse.Namespace, settings: Settings,
                          client: Client | None = None) -> ResolveInput:
    """The decision the options describe, for the question the task asks, signed with the approver's key.
    Temporal is asked (through `client`, else a connection of its own) unless --key and --question say it."""
    by, key_file = _approver(args)
    try:
        key = load_key_file(key_file)
    except ValueError as err:
        raise ClientError(str(err)) from None
    intent_key, question = args.key, args.question
    if intent_key is None or question is None:
        cp = await checkpoint_of(client or await connect(settings), args.task_id)
        wait = cp.waiting_for
        if wait is None:
            raise ClientError(f"{args.task_id} is {cp.state}, not waiting for a decision")
        if intent_key is not None and intent_key != wait.intent_key:
            raise ClientError(f"{args.task_id} waits for a decision on {wait.intent_key}, not --key {intent_key}")
        if question is not None and question != wait.question:
            raise ClientError(f"{args.task_id} asks question {wait.question} ({wait.reason} on {wait.tool}), "
                              f"not --question {question}")
        # The task may have moved on since the person looked: say what this signs, and how to pin it.
        print(f"deciding what {args.task_id} waits for now: {wait.tool} {json.dumps(wait.arguments, sort_keys=True)}"
              f" ({wait.reason}, since {wait.since}); --key {wait.intent_key} --question {wait.question} decides "
              "exactly this question", file=sys.stderr)
        intent_key, question = wait.intent_key, wait.question
    if args.decision == "mark_performed" and not args.provider_ref:
        raise ClientError("mark_performed needs --provider-ref (the provider's id of the effect, e.g. re_...)")
    try:
        decision = ResolveInput(task_id=args.task_id, intent_key=intent_key, decision=args.decision,
                                decided_by=by, note=args.note, provider_ref=args.provider_ref,
                                question=question or None)  # 0: asked before questions were numbered
    except ValidationError as err:
        raise ClientError(f"bad decision: {err.errors()[0]['msg']}") from None
    return sign(decision, key, timedelta(minutes=args.valid_for))


async def cmd_resolve(args: argparse.Namespace, settings: Settings) -> int:
    """Sign a decision on the call a task waits for and send it through the `decide` Update."""
    client = await connect(settings)
    receipt = await decide(client, await signed_decision(args, settings, client))
    print(f"{args.task_id}: {receipt.decision} on {receipt.intent_key} by {receipt.decided_by}; now {receipt.state}")
    return 0


async def cmd_sign(args: argparse.Namespace, settings: Settings) -> int:
    """Print a signed decision as JSON: paste it into the Web UI's Send a Signal form (`resolve`)."""
    print((await signed_decision(args, settings)).model_dump_json(indent=2))
    return 0


async def cmd_keygen(args: argparse.Namespace, settings: Settings) -> int:
    """A new approver key pair: the private key to a file, the worker's APPROVERS entry to stdout."""
    out: Path = args.out.expanduser()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        key = new_key_file(out)
    except FileExistsError:
        raise ClientError(f"{out} exists; keys are never overwritten") from None
    except OSError as err:
        raise ClientError(f"cannot write {out}: {err.strerror}") from None
    print(f"private key: {out} (keep it to yourself; it signs your decisions)")
    print(f"add to the worker's APPROVERS (comma-separated): {args.name}={public_key_text(key)}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for name, run, text in (("resolve", cmd_resolve, "sign a decision on the call a task waits for and send it"),
                            ("sign", cmd_sign, "print a signed decision, for the Web UI's signal form")):
        r = sub.add_parser(name, help=text)
        r.add_argument("task_id")
        r.add_argument("decision", choices=typing.get_args(Decision))
        r.add_argument("--by", help="the approver's name, as in the worker's APPROVERS (default: $APPROVER, "
                                    "else the local stack's approver)")
        r.add_argument("--key-file", help="the approver's private key (default: $APPROVER_KEY_FILE, else the "
                                          "local stack's)")
        r.add_argument("--note", default="")
        r.add_argument("--key", help="intent key of the call (default: the one the task waits for)")
        r.add_argument("--question", type=int, metavar="N",
                       help="the question it answers, from the task's waiting_for (default: the one the task "
                            "asks now); a call asked about again is a new question")
        r.add_argument("--provider-ref", help="the provider's id of the effect, for mark_performed")
        r.add_argument("--valid-for", type=float, default=60, metavar="MINUTES", help="the signature's lifetime")
        r.set_defaults(run=run)
    kg = sub.add_parser("keygen", help="create an approver's key pair")
    kg.add_argument("name", help="the approver's name, e.g. alice@example.com")
    kg.add_argument("--out", required=True, type=Path, help="file for the private key (created, mode 600)")
    kg.set_defaults(run=cmd_keygen)
