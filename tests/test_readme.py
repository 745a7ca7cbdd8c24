"""The README's runbook works as written, in order, from an empty data folder: its first block runs
the real `make up` (on free ports and a fresh folder, through the Makefile's STACK_ARGS) and `make
status`; its `sh` command blocks, extracted from README.md itself, run in order in a fresh bash, each
exiting 0 (`reconcile` exits 1 only on findings, and a fresh stack has none); its Web UI directions
are followed in headless Chromium; then `make down` stops the stack and `make status` says it is down
with a non-zero exit.

The stack runs on free ports, so the shell gets the `export` lines `make up` prints (as a reader who
changed a port would paste them); with the default ports the commands need none.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import async_playwright, expect
from temporalio.client import Client

from core.models import Checkpoint
from devstack.polling import poll_until
from devstack.processes import free_port
from infra.codec import data_converter
from tests.test_web_ui import CHROMIUM, CHROMIUM_ARGS

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def runbook_blocks() -> list[str]:
    """The ```sh blocks of the README's Runbook, in order."""
    text = README.read_text()
    runbook = text[text.index("## Runbook"):text.index("\n## ", text.index("## Runbook") + 1)]
    return re.findall(r"^```sh\n(.*?)^```", runbook, flags=re.MULTILINE | re.DOTALL)


def stack_commands() -> list[str]:
    """The commands of the README's block that brings the stack up and down: make up, status, down."""
    text = README.read_text()
    section = text[text.index("### Bring the stack up and down"):]
    block = re.search(r"^```\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    assert block, "the README shows how to bring the stack up and down"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]


@dataclass
class MadeUp:
    """What `make up` started, read from its output and its state file, as a reader would."""

    data_dir: Path
    stack_args: str
    shell_env: dict[str, str]
    state: dict[str, Any]

    def make(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", f"{command} STACK_ARGS='{self.stack_args}'"], cwd=ROOT,
                              env=self.shell_env, capture_output=True, text=True, timeout=300)

    @property
    def address(self) -> str:
        return self.state["env"]["TEMPORAL_ADDRESS"]

    @property
    def ui_url(self) -> str:
        return self.state["ui_url"]


@pytest.fixture
def made_up(tmp_path: Path) -> Iterator[MadeUp]:
    """`make up` from an empty data folder, on free ports; `make down` afterwards whatever happened."""
    data_dir = tmp_path / "local"
    args = (f"--data-dir={data_dir} --temporal-port={free_port()} --ui-port={free_port()} "
            f"--stripe-port={free_port()}")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "PAYLOAD_", "APPROVER"))}
    up_command, status_command, down_command = stack_commands()
    assert (up_command, status_command, down_command) == ("make up", "make status", "make down")
    stack = MadeUp(data_dir, args, {**clean, "METRICS_PORT": str(free_port())}, {})
    up = stack.make(up_command)
    try:
        assert up.returncode == 0, f"make up: exit {up.returncode}\n{up.stderr[-2000:]}\n{up.stdout[-2000:]}"
        stack.state = json.loads((data_dir / "stack.json").read_text())
        exports = dict(re.findall(r"^export (\w+)=(.*)$", up.stdout, flags=re.MULTILINE))
        assert exports, up.stdout
        # Pasted into the reader's shell: the values are shell-quoted as printed.
        stack.shell_env = {**clean, **{k: shlex.split(v)[0] for k, v in exports.items()}}
        yield stack
    finally:
        down = stack.make(down_command)
        assert down.returncode == 0, down.stderr


def test_the_readme_has_runnable_blocks():
    blocks = runbook_blocks()
    commands = [line for block in blocks for line in block.splitlines() if line.strip()]
    assert len(blocks) >= 6 and len(commands) >= 20, blocks
    for line in commands:
        assert line.startswith((".venv/bin/python starter.py ", ".venv/bin/python -m devstack ",
                                ".venv/bin/temporal ")), line
    assert "../" not in README.read_text(), "the README points outside the repository"


async def test_readme_commands_and_web_ui_directions(made_up: MadeUp, tmp_path: Path):
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing (make test installs it)", pytrace=False)
    status = made_up.make("make status")
    assert status.returncode == 0 and "worker" in status.stdout and "not running" not in status.stdout, status
    env = made_up.shell_env
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
    lines = [line for line in (made_up.data_dir / "worker.log").read_text().splitlines() if line.strip()]
    assert len(lines) > 50
    for line in lines:
        assert isinstance(json.loads(line), dict), line

    # The block's last command, then its status: down, said so, and a non-zero exit.
    down = made_up.make("make down")
    assert down.returncode == 0 and "The stack is down." in down.stdout, down
    after = made_up.make("make status")
    assert after.returncode != 0 and "not up" in after.stdout, after
