"""`python -m devstack.eval` (`make eval`): grade agent runs on the world, not on the reply.

    python -m devstack.eval                                  # built-in tickets x all conditions x default columns
    python -m devstack.eval --tickets ours.jsonl             # plus a team's own tickets (see tickets.py)
    python -m devstack.eval --conditions none,keys-ignored --columns scripted,naive,openai:gpt-4o-mini
    python -m devstack.eval --hold                           # keep the stack and its Web UI up afterwards

Starts its own stack (free ports, a data folder), runs every ticket under every condition in
every column, grades each run from the records, prints the table and writes report.json and
report.html. Exit 0 when every run outside the baseline passed; 1 when one paid twice, lost its
task, told the customer something false, or failed another check; 2 on a configuration mistake.
The baseline column (naive) is graded and shown, and is expected to fail: it never sets the exit
code.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from devstack.eval.columns import default_columns, parse_columns
from devstack.eval.conditions import CONDITIONS, by_names
from devstack.eval.report import html_report, json_report, markdown, summary, terminal_table, verdict
from devstack.eval.runner import Run, Runner
from devstack.eval.tickets import BUILT_IN, TicketFileError, load_tickets
from devstack.processes import StackError
from devstack.stack import Stack
from infra.exit import run_main
from infra.settings import PROJECT_ROOT

DEFAULT_OUT = PROJECT_ROOT / ".local" / "eval"


class ConfigMistake(Exception):
    """Printed as one line on stderr; exit 2."""


def exit_code(runs: list[Run]) -> int:
    return 1 if any(not r.passed for r in runs if not r.baseline) else 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m devstack.eval", description=__doc__.split("\n\n")[0])
    p.add_argument("--tickets", type=Path, help="a JSONL file of your own tickets with their expected effects")
    p.add_argument("--no-built-in", action="store_true", help="only the tickets of --tickets")
    p.add_argument("--only", help="comma-separated ticket ids to run")
    p.add_argument("--conditions", help=f"comma-separated, default all: {','.join(c.name for c in CONDITIONS)}")
    p.add_argument("--columns", help="comma-separated: scripted, naive, claims-unasked, lying:LIE (lying:all: one "
                                     "column per lie), openai:MODEL, "
                                     "anthropic:MODEL (default scripted,naive and each real backend whose "
                                     "key and EVAL_OPENAI_MODEL / EVAL_ANTHROPIC_MODEL are set)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where report.json and report.html go")
    p.add_argument("--markdown", action="store_true", help="also print the table as Markdown (the README's)")
    p.add_argument("--headless", action="store_true", help="no Web UI (the HTML report then has no links)")
    p.add_argument("--hold", action="store_true", help="keep the stack and Web UI up until Enter or Ctrl-C")
    p.add_argument("--settle-timeout", type=float, default=90.0, help="seconds a run may take before it is lost")
    return p


def plan(args: argparse.Namespace):
    tickets = [] if args.no_built_in else list(BUILT_IN)
    try:
        if args.tickets:
            tickets += load_tickets(args.tickets)
        conditions = by_names(args.conditions.split(",")) if args.conditions else list(CONDITIONS)
        columns = parse_columns(args.columns) if args.columns else default_columns()
    except (TicketFileError, ValueError) as err:
        raise ConfigMistake(str(err)) from None
    if args.only:
        wanted = args.only.split(",")
        missing = [w for w in wanted if w not in {t.id for t in tickets}]
        if missing:
            raise ConfigMistake(f"no ticket {missing[0]!r}; have {', '.join(t.id for t in tickets)}")
        tickets = [t for t in tickets if t.id in wanted]
    if not tickets:
        raise ConfigMistake("no tickets to run: give --tickets FILE or drop --no-built-in")
    ids = [t.id for t in tickets]
    if len(set(ids)) != len(ids):
        raise ConfigMistake(f"ticket ids must be unique across built-ins and --tickets: {ids}")
    return tickets, conditions, columns


async def evaluate(args: argparse.Namespace, console: Console) -> int:
    tickets, conditions, columns = plan(args)
    data_dir = Path(tempfile.mkdtemp(prefix="eval-"))
    stack = Stack.for_tests(data_dir, headless=args.headless)
    total = len(tickets) * len(conditions) * len(columns)
    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    _log_to(args.out / "workers.log")
    try:
        await asyncio.to_thread(stack.start)
        console.print(f"stack up: Temporal {stack.address}, Web UI {stack.ui_url or 'off'}, data {data_dir}")
        runner = Runner(stack, data_dir, settle_timeout=args.settle_timeout)
        progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=console, transient=False)
        with progress:
            bar = progress.add_task("eval", total=total)

            def done(run: Run) -> None:
                progress.update(bar, advance=1, description=f"{run.ticket} / {run.condition} / {run.column}: "
                                                            f"{verdict(run)}")
            runs = await runner.run(tickets, conditions, columns, done)
        code = exit_code(runs)
        meta = {"tickets": [t.id for t in tickets], "conditions": [c.name for c in conditions],
                "columns": [c.spec for c in columns], "baseline": [c.spec for c in columns if c.baseline],
                "seconds": round(time.monotonic() - started, 1), "platform": sys.platform, "cpus": os.cpu_count()}
        (args.out / "report.json").write_text(json_report(runs, code, meta))
        (args.out / "report.html").write_text(html_report(runs, code, meta))
        console.print(terminal_table(runs))
        for column, figures in summary(runs).items():
            console.print(f"{column}{' (baseline, expected to fail)' if figures['baseline'] else ''}: "
                          f"{figures['passed']}/{figures['runs']} passed, paid twice {figures['pays_twice']}, "
                          f"lost {figures['lost']}, false claims {figures['false_claim']}")
        for run in runs:
            if not run.passed and not run.baseline:
                why = "; ".join(c.detail for c in run.grade.checks.values() if not c.ok)
                trail = "; ".join(f"{step}: {' / '.join(lines)}" for step, lines in run.observed.trail.items())
                why += f" [{trail}]" if trail else ""
                console.print(f"[bold red]FAILED[/] {run.ticket} / {run.condition} / {run.column} "
                              f"({run.task_id}): {escape(why)}", markup=True, highlight=False)
        if args.markdown:
            print(markdown(runs))
        console.print(f"{total} runs in {time.monotonic() - started:.0f} s; reports in {args.out}/report.json "
                      f"and report.html; worker logs in {args.out}/workers.log")
        if args.hold:
            console.print(f"Web UI {stack.ui_url}; Enter or Ctrl-C stops the stack")
            await asyncio.to_thread(sys.stdin.readline)
        return code
    finally:
        await asyncio.to_thread(stack.stop)
        shutil.rmtree(data_dir, ignore_errors=True)


def _log_to(path: Path) -> None:
    """The in-process workers' logs (activity failures the faults provoke, alerts) go to a file,
    so that the terminal shows the progress bar and the table."""
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    console = Console(stderr=False)
    try:
        return asyncio.run(evaluate(args, console))
    except (ConfigMistake, StackError) as err:
        print(f"eval: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    run_main(main)
