"""Retry policies and timeouts, one named constant per tool class.

Temporal owns retries. The Stripe SDK's own retries are off (see activities/payments.py),
so each attempt here is one request carrying the same intent key. Money and irreversible
activities may be retried only because they verify with the ledger and the provider first.

A worker SIGKILLed mid-step (issue 15; `python -m devstack.resume` measures it) is noticed at once
by its liveness keeper, which fails the attempt (infra/liveness.py); when the keeper died too,
when the attempt's heartbeat timeout (3 s) runs out. The retry starts one first interval later. Both are
timers of the server, which schedules nothing sooner than `history.timerProcessorMaxTimeShift`
(1 s) after its timer queue last read: a retry interval under a second often comes out at about a
second after a timeout, and a heartbeat timer moved on by a heartbeat fires up to a second late
(activities/heartbeats.py sends none in a step's first 0.3 s for that reason). So the heartbeat
timeout and the first intervals are short, and each class keeps the time its attempts span (the
sum of its intervals: its window for riding out a real outage) about where it was.
"""

from datetime import timedelta

from temporalio.common import RetryPolicy

from core.failures import InvalidToolInput
from core.models import ToolClass

# "Configuration": nothing raises it any more; it stays so that recorded retry policies keep their words.
NON_RETRYABLE = [InvalidToolInput.__name__, "Configuration"]


def _bounded(first: timedelta, longest: timedelta, attempts: int) -> RetryPolicy:
    return RetryPolicy(initial_interval=first, backoff_coefficient=2.0, maximum_interval=longest,
                       maximum_attempts=attempts, non_retryable_error_types=NON_RETRYABLE)


# Backoff 0.25, 0.5, 1, 2, then 4 s: the nine retries span 23.75 s, as long as a money call's (below). A
# read that fails because the provider is down is not a question for a person: it is asked again until
# the provider has had as long to come back as a refund gets, and only a longer outage escalates
# (`attempts_exhausted`). Six attempts (7.75 s) were too few: in a chaos run the provider's restart (a
# drawn 1-3 s down, plus its stop and start on a busy machine) refused connections long enough for 13
# tickets in a row to be put to a person over a read.
READ_POLICY = _bounded(timedelta(milliseconds=250), timedelta(seconds=4), 10)
IDEMPOTENT_WRITE_POLICY = READ_POLICY
# Ten attempts, close together: a paused worker's open activity polls (five by default) can each
# swallow a retry that then times out (seen: attempts 3-7 of one call), and an attempt may only wait
# out another's settle horizon (activities/effects.py) before the provider is asked again. The first
# retry 0.25 s after a failure: how many retries a paused worker swallows is bounded by its open
# polls, not by time, so retrying sooner spends no more attempts on it than the five it can take, and
# each swallowed one costs a 3 s heartbeat timeout. Waiting out a settle horizon or a budget in flight
# sets its own delay (next_retry_delay). Backoff 0.25, 0.5, 1, 2, then 4 s: the nine retries span
# 23.75 s, the window in which a provider that cannot be read recovers before the last attempt
# answers `unknown` and a person decides.
MONEY_POLICY = _bounded(timedelta(milliseconds=250), timedelta(seconds=4), 10)
IRREVERSIBLE_POLICY = _bounded(timedelta(seconds=1), timedelta(seconds=10), 3)
# Backoff 0.5, 1, 2, 4, 8 s: 15.5 s. A provider's rate limit
# or overload sets the delay itself (Retry-After, activities/backends/_errors.py).
MODEL_POLICY = _bounded(timedelta(milliseconds=500), timedelta(seconds=30), 6)

# Storing a dead letter or a human's decision must eventually happen: retry without a cap
# (the pending activity stays visible in the Web UI) rather than fail the task.
OPS_POLICY = RetryPolicy(
    initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
    maximum_interval=timedelta(minutes=5), maximum_attempts=0,
)

POLICY_BY_CLASS = {
    ToolClass.READ: READ_POLICY,
    ToolClass.IDEMPOTENT_WRITE: IDEMPOTENT_WRITE_POLICY,
    ToolClass.MONEY: MONEY_POLICY,
    ToolClass.IRREVERSIBLE: IRREVERSIBLE_POLICY,
}

TOOL_START_TO_CLOSE = timedelta(seconds=60)
# A local activity (the task's policy, a read tool) is bounded from its schedule over all its attempts, not
# per attempt: the SDK's core (temporalio 1.35) starts a start-to-close timer for each attempt of a local
# activity it retries and stops only the last one, so each earlier one fires later, timing out whatever
# attempt then runs, or, once its worker has shut down, panicking in the core's thread. An attempt is
# bounded all the same: by the provider client's timeout (STRIPE_TIMEOUT_SECONDS) and SQLite's busy timeout.
LOCAL_READ_TIMEOUT = timedelta(seconds=60)
# The SDK's core sends heartbeats at most every 0.8 x this; the heartbeat pump beats five times per timeout
# from a thread of its own (activities/heartbeats.py), however busy the event loop. A live attempt is timed
# out only if its worker took it and did not start it in time (admission control, worker.py worker_tuner),
# or a process paused whole: its retry then waits for the live one's lease and settle horizon
# (activities/effects.py), so it costs time and an attempt, never a second effect.
# 3 s, not 1: a worker's death is told by its liveness keeper at once (infra/liveness.py), so this
# timeout only bounds what the keeper cannot see: a paused process, a host lost whole, and an attempt
# the SDK's core took while a garbage collection held the worker's GIL (Python learns of it only after
# the collection). A full collection walks every run the worker holds in cache: a 4,200-ticket week's
# longest was 1.85 s, then 2.21 s, which at 2 s timed an attempt out; 1.43 s since a run keeps fewer
# objects (workflows/_agent.py). Also an activity the server handed eagerly to a worker in its reply to
# a completion the worker sent as it died (the worker never learned of it, nor did its keeper:
# `make resume --load 300` saw 5 among 4,945 other tickets in 20 kills).
TOOL_HEARTBEAT = timedelta(seconds=3)
# The first beat at 0.3 x the timeout after the attempt started at the server, not at once. The server
# arms an attempt's heartbeat timer at its start plus the timeout; a heartbeat only makes it arm a
# later one when that fires, and a timer armed less than a second ahead fires up to a second late (the
# server's timer queue takes nothing sooner than `history.timerProcessorMaxTimeShift`, 1 s, ahead).
# A step that ends within 0.3 x the timeout (most do) sends no heartbeat, and a worker killed in one is
# timed out exactly one timeout after the attempt started (devstack/resume.py); the pump and the liveness keeper both
# keep it (activities/heartbeats.py, infra/liveness.py).
FIRST_BEAT = 0.3
MODEL_START_TO_CLOSE = timedelta(seconds=120)

# Alerts, dead letters, human decisions on the ledger, the task's policy, a signature check.
OPS_START_TO_CLOSE = timedelta(seconds=30)
# A whole comparison of the ledger with the provider (it heartbeats as it pages through both).
RECONCILE_START_TO_CLOSE = timedelta(minutes=10)
