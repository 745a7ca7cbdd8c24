"""An on-call person approves a refund in the Temporal Web UI, in a real headless browser.

Its own stack with the Web UI (not the session's headless one) and a worker process whose approval
ceiling (100.00) is below the SU-88421 refund (118.00), so the task stops at `awaiting_human`. The
browser finds the task through the AgentStatus search attribute, adds the AgentWaitReason,
AgentAmountCents and AgentDeadline columns to the list (Configure Columns) and sees them filled,
reads the task's Current details (whole commands, a step table, all within the pane), picks
`resolve` in the Send a Signal picker (a named handler, listed by the worker), sends the decision,
and sees the completed task's refund (reference and amount) in its Current details.

Each of those is asserted in the DOM and saved as a screenshot in tmp_path (web-ui-1-waiting-list.png,
web-ui-2-waiting-details.png, web-ui-3-signal-picker.png, web-ui-4-completed-details.png), to be
looked at, not only read. Debian's chromium (/usr/bin/chromium, installed by `make test`) is driven
by Playwright; nothing is downloaded at run time. On failure a screenshot and the page's HTML are
left in tmp_path too.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from playwright.async_api import FrameLocator, Locator, Page, async_playwright, expect
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.db import Database
from activities.payments import StripeGateway
from activities.world import World
from client import start_task
from core.models import Checkpoint
from devstack.seed import seed_scenarios
from devstack.stack import STRIPE_API_KEY, Stack
from infra.settings import Settings
from tests.helpers import checkpoint, scenario_task, waiting

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--disable-quic", "--no-first-run",
]
CEILING_CENTS = 10_000  # below the 11800 cents SU-88421 refunds: a human must approve
OPERATOR = "ui-operator@example.com"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def chromium() -> Path:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: this test drives Debian's chromium. "
                    "`make test` installs it; by hand: apt-get install -y chromium", pytrace=False)
    return CHROMIUM


def starter(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "starter.py", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def operator_key(tmp_path: Path) -> tuple[Path, str]:
    """The operator's key pair from `starter.py keygen`: the key file and the worker's APPROVERS entry."""
    key_file = tmp_path / "operator.pem"
    out = starter("keygen", OPERATOR, "--out", str(key_file), env={"PATH": "/usr/bin:/bin"})
    [entry] = re.findall(rf"{re.escape(OPERATOR)}=\S+", out)
    return key_file, entry


@pytest.fixture
def ui_stack(tmp_path: Path, operator_key: tuple[Path, str]) -> Iterator[Stack]:
    """Temporal with its Web UI, localstripe and one worker process, all on free ports."""
    with Stack.for_tests(tmp_path / "stack", headless=False) as stack:
        stack.start_worker(stack.log_file("worker"),
                           extra_env={"APPROVAL_CEILING_CENTS": str(CEILING_CENTS), "APPROVERS": operator_key[1]})
        yield stack


@pytest.fixture
def ui_settings(ui_stack: Stack) -> Settings:
    return Settings(temporal_address=ui_stack.address, task_queue=ui_stack.task_queue,
                    stripe_api_base=ui_stack.stripe_url, stripe_api_key=STRIPE_API_KEY,
                    agent_db_path=ui_stack.agent_db)


@pytest.fixture
def ui_world(ui_settings: Settings) -> World:
    db = Database(ui_settings.agent_db_path)
    gateway = StripeGateway(STRIPE_API_KEY, ui_settings.stripe_api_base, 10.0)
    seed_scenarios(db, gateway)
    return World(db, gateway)


async def open_in_list(page: Page, ui_url: str, workflow_id: str, timeout: float = 60.0) -> None:
    """Open the workflow list filtered on AgentStatus="awaiting_human" and wait for the task's row.

    Visibility is eventually consistent: reload until the row shows up or the deadline passes.
    """
    query = urllib.parse.quote('AgentStatus="awaiting_human"', safe="")
    url = f"{ui_url}/namespaces/default/workflows?query={query}"
    row = task_row(page, workflow_id)
    deadline = time.monotonic() + timeout
    await page.goto(url, wait_until="domcontentloaded")
    while True:
        try:
            await expect(row).to_be_visible(timeout=5_000)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise AssertionError(f"{workflow_id} did not appear in the list for "
                                     f'AgentStatus="awaiting_human" within {timeout:.0f}s') from None
            await page.reload(wait_until="domcontentloaded")
    await expect(row).to_contain_text(re.compile("running", re.IGNORECASE))


def task_row(page: Page, workflow_id: str) -> Locator:
    return page.get_by_role("row").filter(has=page.get_by_role("link", name=workflow_id, exact=True))


WAIT_COLUMNS = ["AgentWaitReason", "AgentAmountCents", "AgentDeadline"]


async def show_wait_columns(page: Page) -> None:
    """Configure Columns: the wait's reason, amount and deadline in, the run id, type, start and end out
    (the list is one screen wide)."""
    await page.get_by_role("button", name="Configure Columns").click()
    for column in ("Run ID", "Type", "Start", "End"):
        await page.get_by_role("button", name=f"Remove {column} column").click()
    for column in WAIT_COLUMNS:
        await page.get_by_role("button", name=f"Add {column} column").click()
    await page.get_by_test_id("drawer-close-button").click()
    await expect(page.get_by_role("heading", name="Configure Workflows Table")).to_be_hidden()  # slid away
    for column in WAIT_COLUMNS:
        await expect(page.get_by_test_id(f"workflows-summary-table-header-cell-{column}")).to_be_visible()


def current_details(page: Page) -> FrameLocator:
    return page.frame_locator("#user-metadata-current-details")


async def open_current_details(page: Page) -> FrameLocator:
    await page.get_by_test_id("user-metadata-tab").click()
    details = current_details(page)
    await expect(details.locator("main")).to_be_visible()
    return details


async def assert_fits(details: FrameLocator) -> None:
    """Nothing in the pane is cut: its document is no wider than the pane."""
    overflow = await details.locator("html").evaluate("e => e.scrollWidth - e.clientWidth")
    assert overflow <= 0, f"current details are {overflow}px wider than their pane"


async def send_resolve_signal(page: Page, payload: dict, tmp_path: Path) -> Path:
    """More Actions > Send a Signal; `resolve` from the picker (a named handler: the worker lists it),
    one JSON payload; Submit. The screenshot of the open picker."""
    await page.get_by_role("button", name="More Actions").click()
    await page.get_by_role("menuitem", name="Send a Signal").click()
    dialog = page.get_by_role("dialog", name="Send a Signal")
    await expect(dialog).to_be_visible()
    await dialog.get_by_test_id("signal-select-button").click()
    resolve = dialog.get_by_role("option", name=re.compile(r"^resolve"))
    await expect(resolve).to_contain_text("signed decision")  # its description, from the workflow
    picker = await shot(page, tmp_path, "3-signal-picker")
    await resolve.click()
    await expect(dialog.get_by_test_id("signal-select-button")).to_have_accessible_name("resolve")
    # The Data editor (CodeMirror) pretty-prints its JSON on blur and the dialog grows. Clicked right
    # after a compact fill, Submit did nothing (the button moved under the click) and a click on the
    # title closed the dialog. So: type it already pretty-printed and blur without the mouse.
    data = dialog.get_by_role("textbox", name="Data")
    await data.fill(json.dumps(payload, indent=2))
    await data.blur()
    assert json.loads(await data.inner_text()) == payload
    submit = dialog.get_by_role("button", name="Submit")
    await expect(submit).to_be_enabled()
    await submit.click()
    await expect(dialog).to_be_hidden()
    await expect(page.get_by_test_id("toast-live-region-polite")).to_contain_text("Workflow signaled")
    return picker


async def shot(page: Page, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"web-ui-{name}.png"
    await page.screenshot(path=str(path))
    return path


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as err:
        return f"({err})"


async def approve_in_browser(chromium: Path, ui_url: str, handle: WorkflowHandle, waiting_cp: Checkpoint,
                             payload: dict, world: World, tmp_path: Path) -> list[Path]:
    """Find the waiting task in the Web UI by its columns, read how to decide, send the decision with
    the `resolve` the picker offers, see the refund in the completed task. The screenshots' paths."""
    wait = waiting_cp.waiting_for
    assert wait is not None
    shots = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS, headless=True)
        # Tall enough that a task's whole Current details are on screen (the page scrolls inside itself).
        page = await browser.new_page(viewport={"width": 1400, "height": 1400}, timezone_id="UTC",
                                      locale="en-US")
        page.set_default_timeout(30_000)
        try:
            # 1. The waiting list, with the wait's reason, amount and deadline as columns.
            await open_in_list(page, ui_url, handle.id)
            await show_wait_columns(page)
            row = task_row(page, handle.id)
            await expect(row).to_contain_text("approval_required: issue_refund")
            await expect(row).to_contain_text("11800")
            deadline = datetime.strptime(wait.deadline, "%Y-%m-%dT%H:%M:%SZ")
            await expect(row).to_contain_text(f"{deadline:%b} {deadline.day}, {deadline.year}")
            shots.append(await shot(page, tmp_path, "1-waiting-list"))

            # 2. The task's Current details: whole commands and a step table, within the pane.
            await row.get_by_role("link", name=handle.id, exact=True).click()
            await page.wait_for_url(f"**/workflows/{handle.id}/**", wait_until="domcontentloaded")
            await expect(page.get_by_role("heading", level=1)).to_contain_text(handle.id)
            status = page.get_by_test_id("execution-status")
            await expect(status).to_have_text(re.compile("running", re.IGNORECASE))
            details = await open_current_details(page)
            await expect(details.locator("main")).to_contain_text("Waiting for a person: approval_required")
            for decision in wait.allowed:
                command = (f"python starter.py sign {handle.id} {decision} --key {wait.intent_key} "
                           f"--question {wait.question} --note 'why'")
                await expect(details.locator("code", has_text=command)).to_have_text(command)
            header = details.locator("table th")
            await expect(header).to_have_text([re.compile(rf"^\W*{h}\W*$") for h in ("step", "outcome", "asks", "attempts")])
            await expect(details.locator("table tr", has_text="issue_refund")).to_contain_text("approval_required")
            await assert_fits(details)
            shots.append(await shot(page, tmp_path, "2-waiting-details"))

            # 3. The signal picker offers `resolve`: picked there, the signed decision pasted, sent.
            shots.append(await send_resolve_signal(page, payload, tmp_path))
            result = await asyncio.wait_for(handle.result(), timeout=60)
            assert result.state == "completed", result

            # 4. The completed task: what it did, the refund's reference and amount first.
            [refund] = world.refunds("SU-88421")
            await page.reload(wait_until="domcontentloaded")  # a fresh load reads the execution from the server
            await expect(status).to_have_text(re.compile("completed", re.IGNORECASE))
            details = await open_current_details(page)
            await expect(details.locator("main")).to_contain_text(f"{handle.id} (SU-88421): completed")
            done = details.locator("li", has_text=refund["id"])
            await expect(done).to_contain_text(f"refund {refund['id']}: 118.00 USD, order SU-88421")
            await expect(done.locator("code").first).to_have_text(refund["id"])
            await assert_fits(details)
            shots.append(await shot(page, tmp_path, "4-completed-details"))
        except BaseException as err:
            failure = tmp_path / "web-ui-failure.png"
            try:
                await page.screenshot(path=str(failure), full_page=True)
                (tmp_path / "web-ui-failure.html").write_text(await page.content())
                err.add_note(f"screenshot: {failure}; page: {page.url}")
            except Exception as shot_err:  # the browser may be what failed
                err.add_note(f"no screenshot: {shot_err}")
            raise
        finally:
            await browser.close()
    return shots


async def test_refund_approved_in_the_web_ui(chromium: Path, ui_stack: Stack, ui_settings: Settings,
                                             ui_world: World, operator_key: tuple[Path, str],
                                             tmp_path: Path) -> None:
    """The decision is signed by `starter.py sign` with the operator's key and pasted into the form."""
    client = await Client.connect(ui_stack.address, data_converter=pydantic_data_converter)
    handle = await start_task(client, ui_settings, scenario_task("SU-88421"))
    try:
        cp = await waiting(handle)
        assert cp.waiting_for is not None
        assert (cp.waiting_for.tool, cp.waiting_for.reason) == ("issue_refund", "approval_required")
        assert ui_world.refunds("SU-88421") == []
        key = cp.waiting_for.intent_key
        payload = json.loads(starter("sign", handle.id, "approve", "--key", key, "--question",
                                     str(cp.waiting_for.question), "--by", OPERATOR, "--key-file",
                                     str(operator_key[0]), "--note", "approved in the Web UI",
                                     env={"PATH": "/usr/bin:/bin"}))
        assert payload["intent_key"] == key and payload["question"] == 1 and payload["signature"]

        shots = await approve_in_browser(chromium, ui_stack.ui_url, handle, cp, payload, ui_world, tmp_path)
        assert [p.name for p in shots if p.stat().st_size > 10_000] == [
            "web-ui-1-waiting-list.png", "web-ui-2-waiting-details.png", "web-ui-3-signal-picker.png",
            "web-ui-4-completed-details.png"]

        refunds = ui_world.refunds("SU-88421")
        assert len(refunds) == 1, refunds
        assert refunds[0]["amount_cents"] == 11_800
        assert refunds[0]["intent_key"] == key
        final = await checkpoint(handle)
        assert final.state == "completed"
        assert len(final.decisions) == 1, final.decisions
        record = final.decisions[0]
        assert record.status == "applied", record
        assert record.decision is not None
        assert (record.decision.decided_by, record.decision.decision, record.decision.intent_key) == (
            OPERATOR, "approve", key)
        described = await handle.describe()
        assert not set(WAIT_COLUMNS) & set(described.raw_description.workflow_execution_info.search_attributes
                                           .indexed_fields), "a task that no longer waits has no wait columns"
    except BaseException as err:
        # pytest keeps only the last few tmp dirs: carry what the worker said in the report itself.
        try:
            err.add_note(f"checkpoint: {(await checkpoint(handle)).model_dump_json()[:2000]}")
        except Exception as query_err:
            err.add_note(f"no checkpoint: {query_err}")
        log = ui_stack.log_file("worker")
        err.add_note(f"worker log {log}, last lines:\n{_tail(log)}")
        raise
