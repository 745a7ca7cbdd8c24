"""The eval's outputs: a terminal table, a Markdown table (for the README), JSON for CI, and a
self-contained HTML page with one row per run linking to the task in the Web UI."""

from __future__ import annotations

import html
import json
import statistics
from datetime import UTC, datetime
from typing import Any

from rich.markup import escape
from rich.table import Table

from devstack.eval.runner import Run

__all__ = ["cell", "html_report", "json_report", "markdown", "summary", "terminal_table", "verdict"]

HEADLINE = ("pays_twice", "lost", "false_claim")


def verdict(run: Run) -> str:
    """`ok`, `escalated` (an honest hand-over to a person), or the failed checks."""
    g = run.grade
    if g.passed:
        return "escalated" if run.observed.state in ("awaiting_human", "dead_lettered") else "ok"
    words = []
    if g.pays_twice:
        words.append("PAID TWICE")
    if g.lost:
        words.append("LOST")
    if g.false_claim:
        words.append("FALSE CLAIM")
    words += [name for name in g.failures if name not in ("truth",) and not (name == "effects" and g.pays_twice)
              and not (name == "state" and g.lost)]
    return ", ".join(words)


def cell(run: Run) -> str:
    effects = run.grade.checks["effects"].cell
    return f"{verdict(run)} ({effects})"


def _rows(runs: list[Run]) -> tuple[list[str], list[tuple[str, str]], dict[tuple[str, str, str], Run]]:
    columns = list(dict.fromkeys(r.column for r in runs))
    rows = list(dict.fromkeys((r.ticket, r.condition) for r in runs))
    by = {(r.ticket, r.condition, r.column): r for r in runs}
    return columns, rows, by


def summary(runs: list[Run]) -> dict[str, dict[str, Any]]:
    """Per column: runs, passed, the headline failures, and median cost."""
    out: dict[str, dict[str, Any]] = {}
    for column in dict.fromkeys(r.column for r in runs):
        mine = [r for r in runs if r.column == column]
        out[column] = {
            "baseline": mine[0].baseline,
            "runs": len(mine),
            "passed": sum(r.passed for r in mine),
            "escalated": sum(r.passed and r.observed.state != "completed" for r in mine),
            "pays_twice": sum(r.grade.pays_twice for r in mine),
            "lost": sum(r.grade.lost for r in mine),
            "false_claim": sum(r.grade.false_claim for r in mine),
            "failed": sum(not r.passed for r in mine),
            "median_turns": statistics.median(r.observed.turns for r in mine),
            "median_tool_calls": statistics.median(r.observed.tool_calls for r in mine),
            "median_seconds": round(statistics.median(r.observed.seconds for r in mine), 2),
        }
    return out


def terminal_table(runs: list[Run]) -> Table:
    columns, rows, by = _rows(runs)
    table = Table(title="Graded on the world: provider effects per intent, ledger, outbox, state, claims")
    table.add_column("ticket")
    table.add_column("condition")
    for column in columns:
        baseline = next(r.baseline for r in runs if r.column == column)
        table.add_column(f"{column}{' (baseline)' if baseline else ''}")
    for ticket, condition in rows:
        cells = []
        for column in columns:
            run = by.get((ticket, condition, column))
            if run is None:
                cells.append("")
                continue
            style = "green" if run.passed else ("yellow" if run.baseline else "bold red")
            cells.append(f"[{style}]{escape(cell(run))}[/]")
        table.add_row(ticket, condition, *cells)
    return table


def markdown(runs: list[Run]) -> str:
    columns, rows, by = _rows(runs)
    heads = [f"{c}{' (baseline)' if by and next(r.baseline for r in runs if r.column == c) else ''}" for c in columns]
    out = ["| ticket | condition | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(columns)]
    for ticket, condition in rows:
        cells = [cell(by[(ticket, condition, c)]) if (ticket, condition, c) in by else "" for c in columns]
        out.append(f"| {ticket} | {condition} | " + " | ".join(cells) + " |")
    s = summary(runs)
    out.append("")
    out.append("| column | runs | passed (of which escalated) | paid twice | lost | false claims | "
               "median turns / tool calls / s |")
    out.append("|---|---|---|---|---|---|---|")
    for column, f in s.items():
        out.append(f"| {column}{' (baseline)' if f['baseline'] else ''} | {f['runs']} | {f['passed']} "
                   f"({f['escalated']}) | {f['pays_twice']} | {f['lost']} | {f['false_claim']} | "
                   f"{f['median_turns']:g} / {f['median_tool_calls']:g} / {f['median_seconds']:.1f} |")
    return "\n".join(out)


def _run_dict(run: Run) -> dict[str, Any]:
    o = run.observed
    return {
        "ticket": run.ticket, "condition": run.condition, "column": run.column, "baseline": run.baseline,
        "task_id": run.task_id, "resource_id": run.resource_id, "passed": run.passed, "verdict": verdict(run),
        "failures": run.grade.failures,
        "checks": {name: {"ok": c.ok, "cell": c.cell, "detail": c.detail} for name, c in run.grade.checks.items()},
        "world": {"state": o.state, "refunds": o.refunds, "payments": o.payments, "ledger": [
            {k: row.get(k) for k in ("intent_key", "tool", "status", "provider_ref")} for row in o.ledger],
            "messages": [{k: m.get(k) for k in ("recipient", "kind", "body")} for m in o.messages],
            "refused_messages": o.refused,
            "final_answer": o.final_answer, "trail": o.trail},
        "cost": {"model_turns": o.turns, "tool_calls": o.tool_calls, "seconds": round(o.seconds, 3)},
        "faults_injected": run.faults, "worker_fault_struck": run.worker_fault, "web_ui": run.ui_url,
    }


def json_report(runs: list[Run], exit_code: int, meta: dict[str, Any]) -> str:
    return json.dumps({"exit_code": exit_code, **meta, "summary": summary(runs),
                       "runs": [_run_dict(r) for r in runs]}, indent=2, default=str)


_CSS = """body{font:14px system-ui,sans-serif;margin:1.5em}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:4px 6px;vertical-align:top;text-align:left}th{background:#f3f3f3}
.ok{background:#e7f6e7}.esc{background:#eef3fb}.fail{background:#fbe3e3}.base{background:#fdf5dc}
.detail{font-size:12px;color:#444;max-width:40em}code{font-size:12px}"""


def _matrix_html(runs: list[Run]) -> str:
    e = html.escape
    columns, rows, by = _rows(runs)
    head = "".join(f"<th>{e(c)}{' (baseline)' if next(r.baseline for r in runs if r.column == c) else ''}</th>"
                   for c in columns)
    body = []
    for ticket, condition in rows:
        cells = []
        for column in columns:
            run = by.get((ticket, condition, column))
            if run is None:
                cells.append("<td></td>")
                continue
            klass = ("ok" if run.observed.state == "completed" else "esc") if run.passed else \
                ("base" if run.baseline else "fail")
            cells.append(f'<td class="{klass}"><a href="#{e(run.task_id)}">{e(cell(run))}</a></td>')
        body.append(f"<tr><td>{e(ticket)}</td><td>{e(condition)}</td>{''.join(cells)}</tr>")
    return f"<table><tr><th>ticket</th><th>condition</th>{head}</tr>{''.join(body)}</table>"


def html_report(runs: list[Run], exit_code: int, meta: dict[str, Any]) -> str:
    e = html.escape
    s = summary(runs)
    head = ["ticket", "condition", "column", "verdict", "state", "effects at provider", "ledger = provider",
            "messages", "claims", "turns", "tool calls", "s", "what people were told", "why", "task"]
    rows = []
    for run in runs:
        klass = ("esc" if run.observed.state != "completed" else "ok") if run.passed else \
            ("base" if run.baseline else "fail")
        c = run.grade.checks
        why = "; ".join(ch.detail for ch in c.values() if ch.detail)
        link = f'<a href="{e(run.ui_url)}">{e(run.task_id)}</a>' if run.ui_url else f"<code>{e(run.task_id)}</code>"
        cells = [run.ticket, run.condition, run.column + (" (baseline)" if run.baseline else ""), verdict(run),
                 c["state"].cell, c["effects"].cell, c["ledger"].cell, c["messages"].cell, c["truth"].cell,
                 str(run.observed.turns), str(run.observed.tool_calls), f"{run.observed.seconds:.1f}"]
        told = "".join(f"<div><b>{e(m['recipient'])}</b>: {e(m['body'])}</div>" for m in run.observed.messages
                       if m.get("kind") != "pickup")
        told += "".join(f"<div><b>refused ({e(str(a.get('reason')))})</b>: {e(str(a.get('message')))} "
                        f"[refund_status {e(str(a.get('refund_status')))}]</div>" for a in run.observed.refused)
        rows.append(f'<tr class="{klass}" id="{e(run.task_id)}">' + "".join(f"<td>{e(x)}</td>" for x in cells)
                    + f'<td class="detail">{told}</td><td class="detail">{e(why)}</td><td>{link}</td></tr>')
    sums = "".join(
        f"<tr><td>{e(col)}{' (baseline)' if f['baseline'] else ''}</td><td>{f['runs']}</td><td>{f['passed']}</td>"
        f"<td>{f['escalated']}</td><td>{f['pays_twice']}</td><td>{f['lost']}</td><td>{f['false_claim']}</td>"
        f"<td>{f['median_turns']:g} / {f['median_tool_calls']:g} / {f['median_seconds']:.1f}</td></tr>"
        for col, f in s.items())
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    verdict_line = "every graded run passed" if exit_code == 0 else "FAILED: a run outside the baseline failed"
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Agent eval {e(when)}</title>
<style>{_CSS}</style></head><body>
<h1>Agent eval: graded on the world, not the reply</h1>
<p>{e(when)} &middot; {e(verdict_line)} (exit {exit_code}) &middot; {len(runs)} runs</p>
<ul>{"".join(f"<li>{e(k)}: {e(', '.join(map(str, v)) if isinstance(v, list) else str(v))}</li>"
             for k, v in meta.items())}
</ul>
<h2>Matrix</h2>
{_matrix_html(runs)}
<h2>Per column</h2>
<table><tr><th>column</th><th>runs</th><th>passed</th><th>of which escalated</th><th>paid twice</th><th>lost</th>
<th>false claims</th><th>median turns / tool calls / s</th></tr>{sums}</table>
<h2>Runs</h2>
<table><tr>{"".join(f"<th>{e(h)}</th>" for h in head)}</tr>{"".join(rows)}</table>
</body></html>
"""
