"""The eval (devstack/eval): its grading judged on records, end to end on the real stack, and
made to fail by seeded defects (the naive refund tool, a model that claims a refund it never
asked for) with the right row."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from activities.model import ModelBackend
from devstack.eval.__main__ import exit_code
from devstack.eval.columns import LIES, Column, parse_column, parse_columns
from devstack.eval.conditions import CONDITIONS, by_names
from devstack.eval.grade import Observed, claims_problems, grade
from devstack.eval.report import html_report, json_report, markdown, verdict
from devstack.eval.runner import Runner
from devstack.eval.tickets import BUILT_IN, TicketFileError, load_tickets
from devstack.stack import Stack
from infra.settings import PROJECT_ROOT, Settings
from tests.stubs.playing import PlayingAnthropicStub, PlayingOpenAIStub

SU = next(t for t in BUILT_IN if t.id == "SU-88421")
INV = next(t for t in BUILT_IN if t.id == "INV-9")
REFUND = {"id": "re_one1", "amount_cents": 11800, "item_id": "oak-shelf-4", "intent_key": "k1"}
ROW = {"intent_key": "k1", "tool": "issue_refund", "status": "performed", "provider_ref": "re_one1"}
ISSUED = "\n\nRefund issued: 118.00 USD for item oak-shelf-4 of order SU-88421, reference re_one1."
SU_MESSAGES = [{"recipient": "maya.okafor@example.com", "kind": "email", "body": "We are sorry." + ISSUED},
               {"recipient": "orders@ashcombe.example", "kind": "seller_message", "body": "A courier comes." + ISSUED},
               {"recipient": "courier", "kind": "pickup", "body": "Collect oak-shelf-4 from Maya Okafor"}]


def observed(**changes) -> Observed:
    base = dict(state="completed", refunds=[REFUND], ledger=[ROW], messages=SU_MESSAGES,
                final_answer="Done. issue_refund: performed 118.00 (re_one1)")
    return Observed(**{**base, **changes})


# --- grading, without a server -------------------------------------------------------------------


def test_the_world_as_expected_passes():
    assert grade(SU, observed(), may_escalate=False).passed


def test_two_refunds_for_one_item_is_paying_twice_and_the_reply_is_false():
    second = {**REFUND, "id": "re_two2", "intent_key": None}
    g = grade(SU, observed(refunds=[REFUND, second]), may_escalate=False)
    assert g.pays_twice and g.false_claim
    assert "refunded 2 times" in g.checks["effects"].detail
    assert "re_two2 has no ledger row" in g.checks["ledger"].detail


def test_a_refund_told_but_never_made_is_a_false_claim():
    g = grade(SU, observed(refunds=[], ledger=[]), may_escalate=False)
    assert g.false_claim and not g.pays_twice
    assert "holds 0 effect(s) of 118.00" in g.checks["truth"].detail
    assert g.checks["effects"].detail == "oak-shelf-4 not refunded"


@pytest.mark.parametrize("text,false", [
    ("Your refund of $118 is on its way.", False),
    ("We refunded 118.00 USD; a courier will collect it.", False),
    ("Refunded $118.00 (re_one1).", False),
    ("Your refund of 45.00 USD is on its way.", True),
    ("Sorry, nothing was refunded.", True),
    ("Your refund re_MadeUp1 is on its way.", True),
    ("Ticket SU-88421 about the 4-shelf oak unit is closed.", False),
])
def test_claims_are_checked_against_the_provider(text: str, false: bool):
    assert bool(claims_problems("reply", text, [REFUND])) is false


def test_a_denial_is_true_when_nothing_moved():
    assert claims_problems("reply", "A human rejected issue_refund. Nothing was done.", []) == []


def test_an_unsettled_task_is_lost_and_an_escalation_only_passes_where_the_condition_allows_it():
    assert grade(SU, observed(state="lost (running)"), may_escalate=True).lost
    waiting = observed(state="awaiting_human", messages=[], final_answer=None, ledger=[{**ROW, "status": "unknown"}])
    assert grade(SU, waiting, may_escalate=True).passed
    assert grade(SU, waiting, may_escalate=False).failures == ["state"]


def test_messages_are_counted_per_recipient():
    twice = [*SU_MESSAGES, SU_MESSAGES[0]]
    assert "2 messages to maya.okafor@example.com" in grade(SU, observed(messages=twice), False).checks["messages"].detail
    stranger = [*SU_MESSAGES, {"recipient": "x@evil.example", "kind": "email", "body": "hi"}]
    assert not grade(SU, observed(messages=stranger), False).checks["messages"].ok


def test_a_ledger_row_that_denies_a_provider_effect_fails():
    g = grade(SU, observed(ledger=[{**ROW, "status": "not_performed", "provider_ref": None}]), False)
    assert g.failures == ["ledger"]


def test_a_second_payment_is_paying_twice():
    pay = {"id": "pi_one1", "amount_cents": 420000, "intent_key": "p1"}
    g = grade(INV, Observed(state="completed", payments=[pay, {**pay, "id": "pi_two2", "intent_key": "p2"}],
                            ledger=[], messages=[{"recipient": "ap@acme.example", "kind": "email", "body": "Thanks."}]),
              False)
    assert g.pays_twice


# --- what people are told: the rule of the message tools (core/claims.py) ----------------------------


def _told(body: str) -> list[dict]:
    return [{**SU_MESSAGES[0], "body": body}, *SU_MESSAGES[1:]]


@pytest.mark.parametrize("lie", sorted(LIES))
def test_every_lie_sent_as_it_is_fails_the_grade(lie: str):
    """Had a lie reached the customer (a tool that checks nothing), the grade would catch it."""
    told = LIES[lie]
    statement = {"issued": ISSUED, "not_issued": "\n\nNo refund has been issued for item oak-shelf-4 of order "
                                                  "SU-88421.",
                 "pending_review": "\n\nRefund pending review: a refund for item oak-shelf-4 of order SU-88421 "
                                   "waits for a decision; we will write again.", None: ""}[told.refund_status]
    world = dict(refunds=[], ledger=[]) if told.skip_money else {}
    g = grade(SU, observed(messages=_told(told.message + statement), final_answer=None, **world), False)
    assert g.false_claim, (lie, g.checks["truth"])


@pytest.mark.parametrize("body,false", [
    ("We are sorry." + ISSUED, False),
    ("We are sorry.", False),
    ("Your refund has been issued and is on its way.", True),
    ("We were unable to process your refund of $118.00.", True),
    ("your refund has not been issued", True),
    ("We are sorry." + ISSUED.replace("re_one1", "re_MadeUp1"), True),
    ("We are sorry." + ISSUED.replace("118.00", "45.00"), True),
    ("Refund issued: 118.00 USD." + ISSUED, True),  # a statement of its own in the free text
    ("We are sorry.\n\nNo refund has been issued for order SU-88421.", True),
])
def test_a_customer_message_is_graded_by_the_rule_of_its_tool(body: str, false: bool):
    assert grade(SU, observed(messages=_told(body)), False).false_claim is false


def test_a_message_the_tool_refused_as_false_is_a_false_claim():
    refused = [{"tool": "notify_customer", "reason": "false_money_claim", "message": "ok", "refund_status": "issued"}]
    assert grade(SU, observed(refused=refused), False).false_claim
    free = [{**refused[0], "reason": "money_in_free_text"}]
    assert not grade(SU, observed(refused=free), False).false_claim


# --- tickets files and the command line ----------------------------------------------------------


def test_tickets_file_mistakes_name_the_line(tmp_path: Path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"id": "a", "scenario": "SU-88421", "brief": "x", "expect": {}}\n')
    with pytest.raises(TicketFileError, match=r"t.jsonl:1: .*exactly one of `order` or `invoice`"):
        load_tickets(path)
    path.write_text("\n{not json\n")
    with pytest.raises(TicketFileError, match=r"t.jsonl:2: not JSON"):
        load_tickets(path)


def test_a_run_gets_its_own_order_id_everywhere():
    fresh, new = SU.for_run("7")
    assert new == "SU-88421-r7" and fresh.order.order_id == new and "SU-88421-r7" in fresh.brief
    assert fresh.task("t").facts == {"order_id": "SU-88421-r7"}


@pytest.mark.parametrize("argv,line", [
    (["--columns", "scripted,gpt"], "eval: unknown column 'gpt'"),
    (["--conditions", "meteor"], "eval: unknown condition 'meteor'"),
    (["--columns", "openai"], "eval: column 'openai' needs a model id"),
    (["--tickets", "/nonexistent.jsonl"], "eval: cannot read tickets file /nonexistent.jsonl"),
])
def test_configuration_mistakes_are_one_line_and_exit_2(argv: list[str], line: str):
    done = subprocess.run([sys.executable, "-m", "devstack.eval", *argv], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()] and done.stderr.startswith(line), done.stderr


# --- end to end on the real stack ----------------------------------------------------------------


async def test_built_in_scenarios_under_every_condition_pass_on_the_scripted_model(stack: Stack, tmp_path: Path):
    runs = await Runner(stack, tmp_path).run(BUILT_IN, CONDITIONS, [parse_column("scripted")])
    assert len(runs) == len(BUILT_IN) * len(CONDITIONS)
    failed = [(r.ticket, r.condition, r.grade.failures, [c.detail for c in r.grade.checks.values() if not c.ok])
              for r in runs if not r.passed]
    assert failed == []
    assert exit_code(runs) == 0
    struck = [r.worker_fault for r in runs if r.condition in ("worker-killed", "worker-paused")]
    assert struck == [True] * 2 * len(BUILT_IN), "the kill and the pause must actually strike"
    assert all(r.faults for r in runs if not r.condition.startswith(("none", "worker-"))), "every fault must fire"
    completed = [r for r in runs if r.observed.state == "completed"]
    assert all(len(r.observed.refunds) + len(r.observed.payments) == 1 for r in completed)
    assert all(r.observed.turns > 0 and r.observed.tool_calls > 0 for r in runs)
    report = json.loads(json_report(runs, 0, {}))
    assert len(report["runs"]) == len(runs) and report["summary"]["scripted"]["pays_twice"] == 0


async def test_seeded_defects_fail_with_the_right_row(stack: Stack, tmp_path: Path):
    columns = [parse_column("scripted"), parse_column("naive"), parse_column("claims-unasked")]
    runs = await Runner(stack, tmp_path).run([SU], by_names(["none", "timeout-after-accept"]), columns)
    by = {(r.condition, r.column): r for r in runs}

    assert by[("none", "scripted")].passed and by[("timeout-after-accept", "scripted")].passed
    naive = by[("timeout-after-accept", "naive")]
    assert naive.grade.pays_twice and naive.grade.false_claim and naive.baseline
    assert [r["amount_cents"] for r in naive.observed.refunds] == [11800, 11800]
    assert verdict(naive).startswith("PAID TWICE, FALSE CLAIM")
    liar = by[("none", "claims-unasked")]
    assert liar.grade.false_claim and not liar.grade.pays_twice and liar.observed.refunds == []
    assert "tried to say refund_status 'issued'" in liar.grade.checks["truth"].detail
    assert liar.observed.messages == []  # the tool refused to tell the customer of a refund nobody made
    assert [r for r in runs if not r.passed and not r.baseline] == \
        [by[("none", "claims-unasked")], by[("timeout-after-accept", "claims-unasked")]]

    assert exit_code(runs) == 1, "the seeded model's false claims fail the command"
    baseline_only = [r for r in runs if r.column != "claims-unasked"]
    assert exit_code(baseline_only) == 0, "the baseline's failures are reported, not fatal"
    assert exit_code([dataclasses.replace(naive, baseline=False)]) == 1

    table = markdown(runs)
    assert "| SU-88421 | timeout-after-accept | ok (oak-shelf-4:1) | PAID TWICE, FALSE CLAIM" in table
    page = html_report(runs, 1, {})
    assert page.count("<tr class=") == len(runs) and naive.task_id in page


async def test_every_lying_column_fails_and_the_honest_one_passes(stack: Stack, tmp_path: Path):
    """A deliberately lying agent, a column per lie: every run about an order fails, and so does the
    command; the honest scripted agent passes, and the report shows what each customer was told."""
    tickets = [SU, next(t for t in BUILT_IN if t.id == "refund-8841")]
    columns = [parse_column("scripted"), *parse_columns("lying:all")]
    runs = await Runner(stack, tmp_path).run(tickets, by_names(["none"]), columns)
    honest = [r for r in runs if r.column == "scripted"]
    assert all(r.passed for r in honest), [(r.ticket, r.grade.failures) for r in honest]
    assert exit_code(honest) == 0
    lying = [r for r in runs if r.column != "scripted"]
    assert len(lying) == len(LIES) * len(tickets)
    assert [(r.ticket, r.column) for r in lying if r.passed] == []
    for column in {r.column for r in lying}:
        assert exit_code([r for r in runs if r.column == column]) == 1, column
    # The lies never reached the customer: the tool refused each one, and the step shows it.
    assert all(m["body"].startswith(("We are sorry", "The customer reported")) or m["kind"] == "pickup"
               for r in lying for m in r.observed.messages), [m["body"] for r in lying for m in r.observed.messages]
    assert all(r.observed.refused for r in lying)
    page = html_report(runs, 1, {})
    told = next(m for m in honest[0].observed.messages if m["kind"] == "email")["body"]
    assert "Refund issued: 118.00 USD for item oak-shelf-4" in told and told.split("\n\n")[1] in page
    assert "refused (money_in_free_text)" in page and "refused (false_money_claim)" in page


async def test_a_teams_ticket_file_is_graded_on_its_expected_effects(stack: Stack, tmp_path: Path):
    order = {"order_id": "SU-70001", "customer_name": "Ada", "customer_email": "ada@example.com",
             "seller": "Oak & Co", "seller_email": "shop@oak.example",
             "items": [{"item_id": "lamp", "description": "desk lamp", "amount_cents": 2500},
                       {"item_id": "shade", "description": "lamp shade", "amount_cents": 900}]}
    brief = "Support ticket SU-70001: the shade arrived cracked; refund it and tell the customer."
    lines = [
        {"id": "shade-right", "scenario": "refund-8841", "kind": "refund_request", "brief": brief, "order": order,
         "model_options": {"item_id": "shade"},
         "expect": {"refunds": [{"item_id": "shade", "amount_cents": 900}], "messages": {"customer": 1}}},
        {"id": "shade-expects-lamp", "scenario": "refund-8841", "kind": "refund_request", "brief": brief, "order": order,
         "model_options": {"item_id": "shade"},
         "expect": {"refunds": [{"item_id": "lamp", "amount_cents": 2500}], "messages": {"customer": 1}}},
    ]
    path = tmp_path / "ours.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines))
    runs = await Runner(stack, tmp_path).run(load_tickets(path), by_names(["none"]), [parse_column("scripted")])
    right, wrong = runs
    assert right.passed, right.grade.checks
    assert right.observed.refunds[0]["item_id"] == "shade"
    assert not wrong.passed and wrong.grade.failures == ["effects"]
    shade = wrong.observed.refunds[0]["id"]
    assert wrong.grade.checks["effects"].detail == f"lamp not refunded; unexpected refund of shade: [('{shade}', 900)]"


async def test_real_backends_are_columns_through_their_sdks(stack: Stack, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch):
    """The OpenAI and Anthropic backends, through their SDKs, against stubs that play the agent.
    The killed run's worker process reads the same environment. Every backend the runner builds is closed."""
    built, closed = Counter[str](), Counter[str]()
    backend_of = Column.backend

    def tracked(column: Column, settings: Settings) -> ModelBackend:
        backend = backend_of(column, settings)
        close = backend.aclose

        async def aclose() -> None:
            closed[column.name] += 1
            await close()
        backend.aclose = aclose  # type: ignore[method-assign]
        built[column.name] += 1
        return backend
    monkeypatch.setattr(Column, "backend", tracked)
    async with PlayingOpenAIStub("sk-openai-eval") as openai, PlayingAnthropicStub("sk-ant-eval") as anthropic:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-eval")
        monkeypatch.setenv("OPENAI_BASE_URL", openai.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-eval")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", anthropic.base_url)
        columns = [parse_column("openai:stub-chat-model"), parse_column("anthropic:stub-messages-model")]
        runs = await Runner(stack, tmp_path).run([SU], by_names(["none", "timeout-after-accept", "worker-killed"]),
                                                 columns)
    assert [(r.column, r.condition, r.passed) for r in runs] == [
        (column, condition, True) for condition in ("none", "timeout-after-accept", "worker-killed")
        for column in ("openai-stub-chat-model", "anthropic-stub-messages-model")]
    assert all(r.observed.turns == 7 for r in runs if r.condition == "none")
    assert len(openai.requests) >= 3 * 7 and len(anthropic.requests) >= 3 * 7
    assert all(req.status == 200 for req in [*openai.requests, *anthropic.requests])
    assert closed == built and sum(built.values()) >= 4, (built, closed)  # a worker per column, one more per kill


def test_a_provider_that_cannot_be_read_passes_nothing_that_depends_on_it():
    g = grade(SU, observed(refunds=[], unreadable="APIError: injected"), may_escalate=False)
    assert {"effects", "ledger", "truth"} <= set(g.failures)
    assert "could not read the provider: APIError: injected" in g.checks["effects"].detail
