"""What the commands print: progress while a task runs, then a short report (the checkpoint on request)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from client.tasks import ActivityWait
from core.models import Checkpoint, Escalation, TaskResult
from infra import connection
from infra.settings import Settings

STARTER = ".venv/bin/python starter.py"


def ui_link(settings: Settings, task_id: str) -> str:
    return f"{settings.temporal_ui_url}/namespaces/{connection.namespace(settings)}/workflows/{task_id}"


def decide_hint(task_id: str, wait: Escalation) -> str:
    """A command that decides this question, runnable as printed (the approver comes from APPROVER /
    APPROVER_KEY_FILE or the local stack): should the task have moved on, it refuses instead."""
    ref = " --provider-ref <the provider's id>" if wait.allowed[0] == "mark_performed" else ""
    question = f" --question {wait.question}" if wait.question else ""
    return f"{STARTER} resolve {task_id} {wait.allowed[0]} --key {wait.intent_key}{question}{ref}"


class Progress:
    """Prints each step when its status or outcome changes, and a wait once."""

    def __init__(self, hint_ctrl_c: bool = True) -> None:
        self._seen: dict[str, str] = {}
        self._hint_ctrl_c = hint_ctrl_c

    def __call__(self, cp: Checkpoint) -> None:
        wait = cp.waiting_for
        if wait is not None and self._seen.get("#wait") != wait.intent_key:
            self._seen["#wait"] = wait.intent_key
            print(f"  {cp.task_id}  waits for a person: {wait.reason} on {wait.tool} ({wait.detail})\n"
                  f"      decide: {decide_hint(cp.task_id, wait)}\n"
                  f"      allowed: {', '.join(wait.allowed)}; deadline {wait.deadline}"
                  + ("\n      Ctrl-C stops watching; the task keeps waiting." if self._hint_ctrl_c else ""),
                  flush=True)
        for name, step in cp.steps.items():
            settle = _IN_FLIGHT.match(step.trail[-1]) if step.trail else None
            if settle and self._seen.get(f"#settle:{name}") != settle.group(1):
                self._seen[f"#settle:{name}"] = settle.group(1)
                until = datetime.fromtimestamp(float(settle.group(1)), UTC)
                print(f"  {cp.task_id}  {name:<22} waits until {_when(until)}: a request of it may still land at the "
                      f"provider; nobody is asked before then", flush=True)
            outcome = step.outcome.value if step.outcome is not None else None
            shown = step.status if outcome in (None, step.status) else f"{step.status} ({outcome})"
            if self._seen.get(name) != shown:
                self._seen[name] = shown
                print(f"  {cp.task_id}  {name:<22} {shown}", flush=True)

    def waits(self, waits: list[ActivityWait]) -> None:
        """A step Temporal runs again later (a safety wait before the provider is asked again, a backoff):
        what it waits for and until when, once per attempt."""
        for wait in waits:
            if self._seen.get(f"#retry:{wait.step}") != str(wait.attempt):
                self._seen[f"#retry:{wait.step}"] = str(wait.attempt)
                why = _ASKING_AGAIN.sub("", wait.why)
                print(f"  {wait.task_id}  {wait.step:<22} waits until {_when(wait.until)}, then runs again "
                      f"(attempt {wait.attempt}): {why}", flush=True)


# The workflow's trail line while it waits out a request's settle horizon (workflows/_agent.py _read_world).
_IN_FLIGHT = re.compile(r"world: in flight until (\d+(?:\.\d+)?)")
# activities/effects.py `_wait` ends its message with the delay; the time shown replaces it.
_ASKING_AGAIN = re.compile(r"; asking the provider again in [\d.]+ s$")


def _when(moment: datetime) -> str:
    """`12:04:31 UTC (in 42 s)`"""
    left = max(0, round((moment - datetime.now(UTC)).total_seconds()))
    return f"{moment:%H:%M:%S} UTC (in {left} s)"


def summary(result: TaskResult) -> dict[str, Any]:
    """State, what was done, what it waits for."""
    cp = result.checkpoint
    done = {name: step.trail[-1] if step.trail else step.status for name, step in cp.steps.items() if step.intent_key}
    return {"task_id": cp.task_id, "state": result.state, "final_answer": result.final_answer, "done": done,
            "waiting_for": cp.waiting_for.model_dump(mode="json") if cp.waiting_for else None}


def print_report(settings: Settings, result: TaskResult, details: bool = False) -> None:
    cp = result.checkpoint
    print(f"{cp.task_id}: {result.state}")
    print(f"  answer: {result.final_answer}")
    for name, step in cp.steps.items():
        if step.intent_key:
            print(f"  {name}: {step.trail[-1] if step.trail else step.status}")
    if details:
        print("  checkpoint:\n  " + cp.model_dump_json(indent=2).replace("\n", "\n  "))
    print(f"  Web UI: {ui_link(settings, cp.task_id)}")
