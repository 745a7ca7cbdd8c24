"""Encrypted payloads: the stored history holds no plaintext customer data while the task runs
and replays, and the codec server decrypts for the Web UI."""

from __future__ import annotations

import base64
import json

import aiohttp
from aiohttp import web
from google.protobuf import json_format
from temporalio.api.common.v1 import Payloads
from temporalio.client import Client
from temporalio.worker import Replayer

from activities.world import World
from devstack.processes import free_port
from devstack.stack import Stack
from infra.codec import ENCODING, EncryptionCodec, codec_app, data_converter, new_key
from infra.settings import Settings
from tests.helpers import run, scenario_task
from worker import build_worker
from workflows import AgentTaskWorkflow, ReconcileWorkflow

PLAINTEXT = [b"Maya Okafor", b"maya.okafor@example.com", b"4-shelf oak unit", b"Ashcombe"]


async def test_history_holds_no_plaintext_customer_data_and_still_replays(stack: Stack, client: Client,
                                                                         settings: Settings, world: World):
    key = new_key()
    converter = data_converter(key)
    encrypted = await Client.connect(stack.address, data_converter=converter)
    task = scenario_task("SU-88421")
    async with build_worker(encrypted, settings):
        result = await run(encrypted, settings, task)
    assert result.state == "completed" and len(world.refunds("SU-88421")) == 1
    # The customer's address is one of the task's parties (its policy, in the checkpoint).
    assert "maya.okafor@example.com" in json.dumps(result.checkpoint.model_dump()), "the codec client reads it back"

    history = await client.get_workflow_handle(task.task_id).fetch_history()
    stored = b"".join(event.SerializeToString() for event in history.events)
    for text in PLAINTEXT:
        assert text not in stored, text
    started = history.events[0].workflow_execution_started_event_attributes
    assert started.input.payloads[0].metadata["encoding"] == ENCODING
    # The transcripts the model turns carry are compressed under the encryption: each stored smaller than it reads.
    turns = [e.activity_task_scheduled_event_attributes.input.payloads[0] for e in history.events
             if e.activity_task_scheduled_event_attributes.activity_type.name == "model_turn"]
    codec = converter.payload_codec
    assert codec is not None
    opened = await codec.decode(turns[1:])
    assert turns[1:] and all(len(s.data) < len(o.SerializeToString()) for s, o in zip(turns[1:], opened, strict=True))

    await Replayer(workflows=[AgentTaskWorkflow, ReconcileWorkflow], data_converter=converter).replay_workflow(history)

    runner = web.AppRunner(codec_app(EncryptionCodec(base64.b64decode(key)), ["http://127.0.0.1:8233"]))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        body = json_format.MessageToJson(Payloads(payloads=list(started.input.payloads)))
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://127.0.0.1:{port}/decode", data=body,
                                    headers={"Origin": "http://127.0.0.1:8233", "X-Namespace": "default"}) as resp:
                assert resp.status == 200
                assert resp.headers["Access-Control-Allow-Origin"] == "http://127.0.0.1:8233"
                decoded = json_format.Parse(await resp.text(), Payloads())
            async with session.post(f"http://127.0.0.1:{port}/decode", data="not json") as resp:
                assert resp.status == 400
    finally:
        await runner.cleanup()
    assert decoded.payloads[0].metadata["encoding"] == b"json/plain"
    assert json.loads(decoded.payloads[0].data)["task_id"] == task.task_id
