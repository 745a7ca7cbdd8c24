"""The README's runbook works as written: its `sh` command blocks, extracted from README.md itself,
run in order in a fresh bash against a stack like the one `make up` starts (Temporal with its Web
UI, localstripe behind the edge, a worker process); then its Web UI directions are followed in
headless Chromium.

The stack runs on free ports, so the shell gets the `export` lines `make up` prints (as a reader who
changed a port would paste them); with the default ports the commands need none.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.async_api import async_playwright, expect
from temporalio.client import Client

from core.models import Checkpoint
from devstack.__main__ import seed_demo_data
from devstack.polling import poll_until
from devstack.stack import Stack
from infra.codec import data_converter
from tests.test_web_ui import CHROMIUM, CHROMIUM_ARGS

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def runbook_blocks() -> list[str]:
    """The ```sh blocks of the README's Runbook, in order."""
    text = README.read_text()
    runbook = text[text.index("## Runbook"):text.index("\n## ", text.index("## Runbook") + 1)]
    return re.findall(r"^```sh\n(.*?)^```", runbook, flags=re.MULTILINE | re.DOTALL)


@pytest.fixture
def made_up(tmp_path: Path) -> Iterator[Stack]:
    with Stack.for_tests(tmp_path / "stack", headless=False, with_worker=True) as stack:
        seed_demo_data(stack.env())  # as `make up` does
        yield stack


def test_the_readme_has_runnable_blocks():
    blocks = runbook_blocks()
    commands = [line for block in blocks for line in block.splitlines() if line.strip()]
    assert len(blocks) >= 6 and len(commands) >= 20, blocks
    for line in commands:
        assert line.startswith((".venv/bin/python starter.py ", ".venv/bin/python -m devstack ",
                                ".venv/bin/temporal ")), line
    assert "../" not in README.read_text(), "the README points outside the repository"


async def test_readme_commands_and_web_ui_directions(made_up: Stack, tmp_path: Path):
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing (make test installs it)", pytrace=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "PAYLOAD_"))}
    env.update(made_up.env())
    nothing = await asyncio.to_thread(subprocess.run, [".venv/bin/python", "starter.py", "list"], cwd=ROOT, env=env,
                                      capture_output=True, text=True, timeout=60)
    assert (nothing.returncode, nothing.stdout) == (0, "no task is awaiting human\n"), nothing
    for block in runbook_blocks():
        done = await asyncio.to_thread(subprocess.run, ["bash", "-e", "-o", "pipefail", "-c", block], cwd=ROOT,
                                       env=env, capture_output=True, text=True, timeout=600)
        shown = f"block:\n{block}\nexit {done.returncode}\nstderr:\n{done.stderr[-2000:]}\nstdout:\n{done.stdout[-1500:]}"
        assert done.returncode == 0, shown
        assert "Traceback" not in done.stderr and "Fatal Python error" not in done.stderr, shown

    # The Web UI directions: a waiting task found with the README's link and shown as Running, its
    # summary on its page, and the tabs and actions the README names.
    ticket = json.loads((ROOT / "docs/examples/ticket-over-ceiling.json").read_text())
    ticket["ticket_id"] = "T-UI-1"
    ticket["facts"]["order_id"] = ticket["order"]["order_id"] = "A-UI-1"  # not refunded by the blocks above
    path = tmp_path / "ticket.json"
    path.write_text(json.dumps(ticket))
    seeded = await asyncio.to_thread(subprocess.run, [".venv/bin/python", "-m", "devstack", "seed", str(path)],
                                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert seeded.returncode == 0, seeded.stderr
    started = await asyncio.to_thread(
        subprocess.run, [".venv/bin/python", "starter.py", "start", "--file", str(path), "--until-waiting"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    task_id = "ticket-T-UI-1"
    summary = f"support · {task_id} · order A-UI-1 · item armchair · $240.00"

    link = re.search(r"http://127\.0\.0\.1:8233(/namespaces/default/workflows\?query=\S+)", README.read_text())
    assert link, "the README gives the link to the waiting tasks"
    path_and_query = link.group(1).rstrip(").,")
    assert urllib.parse.unquote(path_and_query.split("query=")[1]) == 'AgentStatus="awaiting_human"'
    client = await Client.connect(made_up.address, data_converter=data_converter(None))

    async def listed():
        return [e async for e in client.list_workflows(f'AgentStatus="awaiting_human" AND WorkflowId="{task_id}"')]
    await poll_until(listed, f"{task_id} in visibility as awaiting_human", 30.0)

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        page = await browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(30_000)
        try:
            await page.goto(made_up.ui_url + path_and_query, wait_until="domcontentloaded")
            row = page.get_by_role("row").filter(has=page.get_by_role("link", name=task_id, exact=True))
            await expect(row).to_be_visible()
            await expect(row).to_contain_text(re.compile("running", re.IGNORECASE))
            await row.get_by_role("link", name=task_id, exact=True).click()
            await page.wait_for_url(f"**/workflows/{task_id}/**", wait_until="domcontentloaded")
            for tab in ("Queries", "Event History"):
                await expect(page.get_by_role("tab", name=re.compile(tab, re.IGNORECASE)).first).to_be_visible()
            await page.get_by_role("tab", name=re.compile("User Metadata", re.IGNORECASE)).first.click()
            # The tab renders summary and details as markdown inside frames of their own.
            async def shown():
                for frame in page.frames:
                    if await frame.get_by_text(summary).count():
                        return True
                return False
            await poll_until(shown, "the task's summary in the User Metadata tab", 30.0)
            await page.get_by_role("button", name="More Actions").click()
            await expect(page.get_by_role("menuitem", name="Send a Signal")).to_be_visible()
        except BaseException as err:
            shot = tmp_path / "readme-ui-failure.png"
            await page.screenshot(path=str(shot), full_page=True)
            (tmp_path / "readme-ui-failure.html").write_text(await page.content())
            err.add_note(f"screenshot: {shot}; page: {page.url}")
            raise
        finally:
            await browser.close()
    cp = await client.get_workflow_handle(task_id).query("checkpoint", result_type=Checkpoint)
    assert cp.waiting_for is not None and cp.waiting_for.reason == "approval_required"

    # The worker served all of the above (faults, retries, escalations): every line it wrote is JSON.
    lines = [line for line in made_up.log_file("worker").read_text().splitlines() if line.strip()]
    assert len(lines) > 50
    for line in lines:
        assert isinstance(json.loads(line), dict), line
