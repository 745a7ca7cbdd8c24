"""Exactly once under chaos, small: 30 refund tickets through two worker processes, against a Stripe
edge that faults a seeded fraction of refund requests (one fault holds a refund longer than the client
timeout, another longer than the workers' processing window), in both edge modes, one on a SQLite ledger
and one on a PostgreSQL ledger of its own; some tickets refund an item another ticket refunds, some
split an item's refund (devstack/chaos.py, `make chaos`, is the same with 300 tickets). Every fault kind
happens at least once (devstack/chaos_faults.py): workers SIGKILLed and restarted, paused (SIGSTOP) and
woken, both paused at once, SIGKILLed and SIGSTOPped at the product's own crash points, the Temporal
dev server SIGKILLed and restarted on its file, the provider restarted, and on PostgreSQL every
connection to the run's database terminated for a while. Faults come every 0.5-2 s here (1-5 s in
`make chaos`) so that each kind fits into a short run. Judged on the quiet world by the independent
judge (devstack/judge/): every worker stopped and the settle horizons passed, the provider's refunds
per order item, the ledger and the outbox; one ticket in each mode is a negative control (the naive
refund tool) the judge must flag.

Exit codes of killed workers (-9) are not failures; a worker that dies while nobody killed it is,
and so is a worker stopped at the end (SIGTERM) that exits with anything but 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.chaos import ALL_KINDS, BEYOND, POST_FAULTS, SLOW_POST_SECONDS, WORKERS, fault_rules, run_chaos, table
from devstack.judge import table as judge_table

TICKETS = 30
RATE = 2.0  # tickets started per second: 15 s of starts, so the aimed faults find work to hit
# Half the refund lookups answer in 0.6 s (under the 1 s client timeout), so that a few tasks are
# always in flight and a kill finds work to interrupt.
# The third refund POST is always held past the client timeout, whatever the draws give the others
# (and the tenth past the processing window: run_chaos puts that rule in front).
RULES = [{"fault": "slow", "method": "POST", "path": "/v1/refunds", "nth": [3], "delay_seconds": SLOW_POST_SECONDS},
         *fault_rules(post_probability=0.07, slow_probability=0.5, slow_seconds=0.6)]


# A refund POST held past its settle horizon, unanswered, is never sent again: past the horizon, with the
# provider showing nothing, the intent goes to a person (`may_land_late`), in both modes.
CASES = [("dedupe", "sqlite", ALL_KINDS), ("passthrough", "postgres", ALL_KINDS)]


@pytest.mark.parametrize("mode, ledger, kinds", CASES)
async def test_exactly_once_with_every_fault_kind(mode: str, ledger: str, kinds: tuple[str, ...], tmp_path: Path):
    wanted = tuple(k for k in kinds if k != "ledger connections cut" or ledger == "postgres")
    report = await run_chaos(mode, TICKETS, seed=20, data_dir=tmp_path / mode, rate=RATE, chaos_tail=90.0,
                             settle_timeout=90.0, say=lambda line: None, rules=RULES, ledger=ledger,
                             kinds=wanted, every=(0.5, 2.0), pause=(1.5, 4.0))
    shown = table([report]) + "\n" + judge_table(report.verdict)
    print(shown)
    verdict = report.verdict

    assert sorted(report.asked) == sorted(wanted), shown
    assert report.short == {}, shown  # each kind at least once
    assert {p.split()[1] for p in report.aimed} == {"SIGKILL", "SIGSTOP"}, shown
    assert bool(report.held) == (BEYOND in wanted), shown  # a POST held past the window, and what became of it
    assert ledger == "sqlite" or report.connections_cut > 0, shown
    assert report.faults.get("slow:POST", 0) > 0, shown  # a refund held past the client timeout
    assert report.tickets["second"] > 0 and report.tickets["split"] > 0 and report.tickets["rest"] > 0, shown
    assert report.resume["activity"] or report.resume["workflow_task"], shown  # a kill cut into work
    assert sum(report.faults.get(f"{kind}:POST", 0) for kind in POST_FAULTS) > 0, shown
    assert report.unexpected_worker_exits == 0, shown
    # Every worker stopped on SIGTERM with 0 (its graceful shutdown takes at most 5 s; the stop SIGKILLs after
    # 10 s). A run being evicted re-raises its CancelledError: a worker holding one that went on awaiting hung
    # here and was SIGKILLed.
    assert report.stop_exit_codes == [0] * WORKERS, shown

    assert verdict.lost == [], shown
    assert sum(t.end.state == "completed" for t in verdict.tickets.values()) > TICKETS // 2, shown  # it did the work
    assert report.controls >= 1 and verdict.flagged == verdict.controls, shown  # the controls, and only them
    assert verdict.settled_escalations == [], shown
    assert report.passed, shown


def test_a_run_with_fewer_faults_than_asked_fails():
    """The pass rule itself: a kind asked for and not seen is a failure with its reason."""
    from collections import Counter

    from devstack.chaos import ChaosReport
    from devstack.judge.verdict import Verdict

    quiet = Verdict({}, {}, {}, {}, [], [], 0, 0)
    report = ChaosReport(mode="dedupe", tasks=0, kills=1, faults={"slow:POST": 1}, pauses=0, tickets=Counter(),
                         controls=0, verdict=quiet, resume={}, unattributed_timeouts=[], paused_timeouts=0,
                         unexpected_worker_exits=0, stop_exit_codes=[], seconds={},
                         asked={"kill": 1, BEYOND: 1}, happened={"kill": 1})
    assert not report.passed
    assert report.why_not() == [f"fewer faults than asked: {BEYOND} 0 of at least 1"]


class _History:
    """A task's history as the rest check reads it: events from a list."""

    def __init__(self, events: list) -> None:
        self.events = events

    async def fetch_history_events(self, **_: object):
        for event in self.events:
            yield event


def _event(event_id: int, kind: str, at: float, **attributes: object):
    from google.protobuf.timestamp_pb2 import Timestamp
    from temporalio.api.enums.v1 import EventType
    from temporalio.api.history.v1 import HistoryEvent

    when = Timestamp()
    when.FromMicroseconds(int(at * 1e6))
    event = HistoryEvent(event_id=event_id, event_type=EventType.Value(f"EVENT_TYPE_{kind}"), event_time=when)
    for field, values in attributes.items():
        getattr(event, field).CopyFrom(type(getattr(event, field))(**values))
    return event


async def test_a_task_awaiting_a_person_is_at_rest_only_when_nothing_of_its_own_can_run_before_the_stop():
    """The settle rule before the workers are stopped (devstack/chaos.py `Restless`): a task asking a person is
    left to the stop only when no activity or workflow task of its own is open and no timer of its own fires
    before every worker has had SIGTERM; otherwise its recheck could withdraw the question and run on under a
    stopping worker, and the judge would call it lost."""
    from google.protobuf.duration_pb2 import Duration

    from devstack.chaos import Restless, Tracker

    now = 1_000_000.0
    asked = [_event(1, "WORKFLOW_TASK_SCHEDULED", now - 9), _event(2, "WORKFLOW_TASK_COMPLETED", now - 9)]

    def timer(event_id: int, fires_in: float) -> object:
        return _event(event_id, "TIMER_STARTED", now - 1, timer_started_event_attributes={
            "timer_id": str(event_id), "start_to_fire_timeout": Duration(seconds=int(fires_in + 1))})

    def read(event_id: int, at: float, closed: str = "COMPLETED") -> list:
        attributes = {f"activity_task_{closed.lower()}_event_attributes": {"scheduled_event_id": event_id}}
        return [_event(event_id, "ACTIVITY_TASK_SCHEDULED", at - 1),
                _event(event_id + 1, f"ACTIVITY_TASK_{closed}", at, **attributes)]

    fired = _event(4, "TIMER_FIRED", now, timer_fired_event_attributes={"timer_id": "3"})
    cancelled = _event(4, "TIMER_CANCELED", now, timer_canceled_event_attributes={"timer_id": "3"})
    cases = {
        "recheck due before the stop": [*asked, timer(3, 5)],
        "recheck due after the stop": [*asked, timer(3, 60)],
        "recheck fired, its read running": [*asked, timer(3, 5), fired, _event(5, "ACTIVITY_TASK_SCHEDULED", now)],
        "read done, workflow task open": [*asked, *read(3, now - 1), _event(5, "WORKFLOW_TASK_SCHEDULED", now)],
        "read failed, next recheck far": [*asked, *read(3, now - 1, "FAILED"), _event(5, "WORKFLOW_TASK_SCHEDULED", now),
                                          _event(6, "WORKFLOW_TASK_COMPLETED", now), timer(7, 600)],
        "timer cancelled": [*asked, timer(3, 5), cancelled],
    }
    tracker = Tracker()
    for name, events in cases.items():
        tracker.handles[name] = _History(events)  # type: ignore[assignment]
        tracker.states[name] = "awaiting_human"
    tracker.states["done"] = "completed"  # not awaiting anyone: not looked at
    restless = Restless(tracker)
    assert sorted(await restless.tasks(now + 10)) == ["read done, workflow task open", "recheck due before the stop",
                                                      "recheck fired, its read running"]


def test_a_timeout_is_explained_only_by_a_kill_of_its_own_window_and_worker():
    """`resumptions` (devstack/chaos.py), which the chaos run and `make resume --load` judge every history by:
    an attempt timed out and retried is a kill's only when the kill came after the attempt was scheduled, or
    killed the worker whose completion, still in flight, scheduled it (and was handed the attempt eagerly); a
    workflow task timed out on a sticky queue is a kill's only when the queue was the killed worker's. Any
    other timeout is a busy worker's: counted, never folded into a resume figure."""
    from temporalio.api.enums.v1 import TimeoutType
    from temporalio.api.failure.v1 import Failure, TimeoutFailureInfo
    from temporalio.api.taskqueue.v1 import TaskQueue

    from devstack.chaos import resumptions
    from devstack.chaos_faults import Kill

    t0 = 1_000_000.0
    heartbeat = Failure(timeout_failure_info=TimeoutFailureInfo(timeout_type=TimeoutType.TIMEOUT_TYPE_HEARTBEAT))
    activity = [
        _event(1, "WORKFLOW_TASK_COMPLETED", t0, workflow_task_completed_event_attributes={"identity": "41@host"}),
        _event(2, "ACTIVITY_TASK_SCHEDULED", t0, activity_task_scheduled_event_attributes={
            "activity_type": {"name": "issue_refund"}}),
        _event(3, "ACTIVITY_TASK_STARTED", t0 + 3, activity_task_started_event_attributes={
            "scheduled_event_id": 2, "attempt": 2, "last_failure": heartbeat, "identity": "42@host"}),
    ]
    sticky = [
        _event(1, "WORKFLOW_TASK_SCHEDULED", t0, workflow_task_scheduled_event_attributes={
            "task_queue": TaskQueue(name="41@host-3f2a")}),
        _event(2, "WORKFLOW_TASK_TIMED_OUT", t0 + 10, workflow_task_timed_out_event_attributes={
            "scheduled_event_id": 1, "timeout_type": TimeoutType.TIMEOUT_TYPE_SCHEDULE_TO_START}),
        _event(3, "WORKFLOW_TASK_STARTED", t0 + 10.5),
    ]
    killed_41 = Kill(t0 + 1, 0, 41, -9)
    assert resumptions(activity, [killed_41]) == ([("activity", t0 + 1, 2.0)], [])
    assert resumptions(activity, []) == ([], [("activity issue_refund heartbeat timeout", t0 + 3)])
    other = Kill(t0 - 0.5, 0, 43, -9)  # another worker, dead before the attempt was scheduled: not its worker's
    assert resumptions(activity, [other])[1] == [("activity issue_refund heartbeat timeout", t0 + 3)]
    # the completer died with its completion in flight: the server scheduled the attempt and handed it to the dead
    assert resumptions(activity, [Kill(t0 - 0.5, 0, 41, -9)]) == ([("handed_to_dead", t0 - 0.5, 3.5)], [])
    # but not a completion long after its worker's death (a reused pid), nor one after its pause ended
    for long_before in (Kill(t0 - 100, 0, 41, -9), Kill(t0 - 5, 0, 41, None, paused_for=3.0)):
        assert resumptions(activity, [long_before])[1] == [("activity issue_refund heartbeat timeout", t0 + 3)]
    # a pause in which the completion was in flight: the pause's
    assert resumptions(activity, [Kill(t0 - 0.5, 0, 41, None, paused_for=4.0)])[0] == [("paused", t0 - 0.5, 3.5)]
    assert resumptions(sticky, [killed_41]) == ([("workflow_task", t0 + 1, 9.5)], [])
    assert resumptions(sticky, [Kill(t0 + 1, 0, 43, -9)]) == (
        [], [("workflow task TIMEOUT_TYPE_SCHEDULE_TO_START", t0 + 10)])
