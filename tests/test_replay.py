"""Every recorded history replays with the current workflow code; a known-bad one does not.

Run `python -m tests.record` to re-record on purpose (see tests/histories/README.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast, overload

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from client.tasks import began_since_fold, keys_begun_with, opening
from core.keys import derive_intent_key
from core.models import TaskInput, ToolInput
from core.tools import REGISTRY
from infra.sandbox import CompiledSandboxRunner
from workflows import AgentTaskWorkflow

HISTORIES = Path(__file__).parent / "histories"
# Recorded with the current code, and kept from earlier code that running tasks may still be on.
CORPUS = sorted(HISTORIES.glob("*.json")) + sorted(HISTORIES.glob("earlier/*/*.json"))


class _Reads:
    """The reads a walk of a history makes (an event handed out, a field of one read), failing the walk as soon
    as they pass `budget`: a walk that is not one pass fails at once instead of running for minutes."""

    def __init__(self, budget: int) -> None:
        self.budget, self.count = budget, 0

    def __call__(self, n: int = 1) -> None:
        self.count += n
        if self.count > self.budget:
            raise AssertionError(f"more than {self.budget} reads: the walk is not one pass")


class _ReadEvent:
    """A history event whose every field read is counted."""

    def __init__(self, event: HistoryEvent, reads: _Reads) -> None:
        self._event, self._reads = event, reads

    def __getattr__(self, name: str) -> Any:
        self._reads()
        return getattr(self._event, name)


class _CountedHistory(Sequence[_ReadEvent]):
    """Events whose walk is counted: each handed out (by iteration, index or slice) and each field read."""

    def __init__(self, events: list[HistoryEvent], reads_per_event: int) -> None:
        self.reads = _Reads(reads_per_event * len(events))
        self.events = [_ReadEvent(e, self.reads) for e in events]

    def __len__(self) -> int:
        return len(self.events)

    @overload
    def __getitem__(self, index: int) -> _ReadEvent: ...
    @overload
    def __getitem__(self, index: slice) -> list[_ReadEvent]: ...
    def __getitem__(self, index: int | slice) -> _ReadEvent | list[_ReadEvent]:
        got = self.events[index]
        self.reads(len(got) if isinstance(got, list) else 1)
        return got

    def __iter__(self) -> Iterator[_ReadEvent]:
        for event in self.events:
            self.reads()
            yield event


def load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, path.read_text())


def replayer(*workflows) -> Replayer:
    # The worker's runner (infra/sandbox.py), so the corpus replays as production runs it.
    return Replayer(workflows=list(workflows or [AgentTaskWorkflow]), data_converter=pydantic_data_converter,
                    workflow_runner=CompiledSandboxRunner())


@pytest.mark.parametrize("era", ["", "earlier/before-second-fold/", "earlier/before-one-marker/",
                                 "earlier/before-ask-after-reading/",
                                 "earlier/before-local-reads/",
                                 "earlier/before-counted-rollover/",
                                 "earlier/before-local-policy/", "earlier/before-human-boundary/"])
def test_the_corpus_covers_every_path(era: str):
    names = {p.stem.rsplit("-run", 1)[0] for p in HISTORIES.glob(f"{era}*.json")}
    assert names >= {"su-88421-happy", "refund-8841-happy", "inv-9-happy", "su-88421-timeout-after-accept",
                     "su-88421-unknown-resolved", "su-88421-approval-granted", "su-88421-approval-rejected",
                     "su-88421-dead-letter", "refund-8841-crash-resume", "long-run-continue-as-new"}
    if era in ("", "earlier/before-second-fold/", "earlier/before-one-marker/", "earlier/before-ask-after-reading/",
               "earlier/before-local-reads/", "earlier/before-counted-rollover/"):  # the paths the human boundary added
        assert names >= {"su-88421-refused-by-the-world", "su-88421-flooded-wait"}


@pytest.mark.parametrize("path", CORPUS, ids=[str(p.relative_to(HISTORIES).with_suffix("")) for p in CORPUS])
async def test_recorded_history_replays(path: Path):
    await replayer().replay_workflow(load(path))


async def test_known_bad_history_is_rejected():
    with pytest.raises(NondeterminismError):
        await replayer().replay_workflow(load(HISTORIES / "known-bad" / "swapped-activity.json"))


def test_a_redrive_knows_the_keys_its_task_began_with():
    """A redrive starts a task again with the intent keys it began with: a run recorded since the second
    fold has messages' money status in them, one recorded before has not (client/tasks.py)."""
    assert all(began_since_fold(load(path).events) is True for path in HISTORIES.glob("*.json"))
    assert all(began_since_fold(load(path).events) is False for path in HISTORIES.glob("earlier/*/*.json"))
    # A start reads only a run's opening events (client/tasks.py `_opening`): they settle it alike.
    for path in [*HISTORIES.glob("*.json"), *HISTORIES.glob("earlier/*/*.json")]:
        events = load(path).events
        assert began_since_fold(opening(events)) is began_since_fold(events), path
        assert len(opening(events)) < len(events), path
    # One pass: a run no worker took up may hold a flood of signals and nothing else.
    flooded = load(HISTORIES / "su-88421-happy.json")
    head = list(flooded.events[:3])
    signal = next(e for e in load(HISTORIES / "su-88421-flooded-wait-run1.json").events
                  if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
    many = _CountedHistory(head + [signal] * 20_000, reads_per_event=4)
    assert opening(cast(Sequence[HistoryEvent], many)) == many.events
    assert many.reads.count > len(many), "the count is live: the events were handed out and read"
    # A run no worker ever took up (terminated or timed out before its first workflow task) began nothing:
    # the task's next run decides its keys.
    unstarted = load(HISTORIES / "su-88421-happy.json")
    del unstarted.events[3:]
    assert [e.event_type for e in unstarted.events][-1] == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
    assert began_since_fold(unstarted.events) is None


@pytest.mark.parametrize("path", CORPUS, ids=[str(p.relative_to(HISTORIES).with_suffix("")) for p in CORPUS])
async def test_every_recorded_intent_key_is_derived_as_its_task_derives_it(path: Path):
    """The keys a run sent its tools are the ones the code derives for its task, from the call's business
    facts and, in a task begun since the second fold, a message's money status (`keys_begun_with`): a key
    derived otherwise on replay would not fail the replay, whose commands do not carry it."""
    history = load(path)
    started = history.events[0].workflow_execution_started_event_attributes
    [task] = await pydantic_data_converter.decode(started.input.payloads, [TaskInput])
    status_keys = keys_begun_with(task, history.events)
    checked = 0
    for event in history.events:
        scheduled = event.activity_task_scheduled_event_attributes
        spec = REGISTRY.get(scheduled.activity_type.name) if event.HasField("activity_task_scheduled_event_attributes") \
            else None
        if spec is None or not spec.needs_key:
            continue
        [call] = await pydantic_data_converter.decode(scheduled.input.payloads, [ToolInput])
        assert call.intent_key == derive_intent_key(spec.name, spec.key_fields, call.arguments, {"task_id": task.task_id},
                                                    extras=spec.key_extras if status_keys else ()), call
        checked += 1
    assert checked or "happy" not in path.name, "a happy path calls keyed tools"
