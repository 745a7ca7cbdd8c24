"""Issue 22, item 1: a payload the worker cannot decode (metadata forged as `binary/encrypted`,
garbage under our key id, another key, no key on the worker) is refused where it stands, never
raised while the SDK decodes an activation. A raise there fails the workflow task before any
handler runs, again on every retry: the task stops answering queries and can never be decided.

End to end, the worker is the product's (infra.connection.connect, worker.build_worker), with a
key and without; the forged messages come through a client with no codec, so they reach Temporal
exactly as written. Judged on the checkpoint, the history and the provider's refunds.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import zlib
from collections import Counter

import aiohttp
import pytest
from aiohttp import web
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from google.protobuf import json_format
from pydantic import BaseModel, SecretStr
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError

from activities.world import World
from devstack.processes import free_port
from infra import connection
from infra.codec import (
    COMPRESSED,
    ENCODING,
    KEY_ID,
    PLAIN_LIMIT,
    UNDECODABLE,
    EncryptionCodec,
    PayloadKeyError,
    codec_app,
    data_converter,
    new_key,
)
from infra.codec import refused as marker
from infra.settings import Settings
from tests.approvers import signed
from tests.helpers import checkpoint, finished, scenario_task, start, wait_for, waiting
from worker import build_worker


def _json(value: object) -> Payload:
    return pydantic_data_converter.payload_converter.to_payloads([value])[0]


def _sealed(key: str, plain: bytes, key_id: bytes = KEY_ID.encode()) -> Payload:
    """Ciphertext under `key` as our codec lays it out (nonce first), around any bytes."""
    nonce = secrets.token_bytes(12)
    return Payload(metadata={"encoding": ENCODING, "encryption-key-id": key_id},
                   data=nonce + AESGCM(base64.b64decode(key)).encrypt(nonce, plain, None))


async def _forged(worker_key: str | None, decision: dict) -> list[tuple[str, Payload, str]]:
    """(what, payload, the reason a worker with `worker_key` gives) for each shape it cannot decode.
    One is a real signed approval encrypted with another key: it must not count either."""
    other = new_key()
    garbage = secrets.token_bytes(64)
    shapes = [
        ("forged metadata, garbage", Payload(metadata={"encoding": ENCODING}, data=garbage), "unknown key id"),
        ("our key id, garbage", Payload(metadata={"encoding": ENCODING, "encryption-key-id": KEY_ID.encode()},
                                        data=garbage), "wrong key"),
        ("our key id, empty", Payload(metadata={"encoding": ENCODING, "encryption-key-id": KEY_ID.encode()}),
         "wrong key"),
        ("another key id", Payload(metadata={"encoding": ENCODING, "encryption-key-id": b"agent-payloads-v9"},
                                   data=garbage), "unknown key id"),
        ("a signed approval under another key",
         (await EncryptionCodec(base64.b64decode(other)).encode([_json(decision)]))[0], "wrong key"),
        ("the worker's key, not a payload", _sealed(worker_key or other, b"\xff\xff not a protobuf"),
         "not a payload" if worker_key else "wrong key"),
    ]
    unkeyed = [(what, payload, reason if worker_key else "key not set") for what, payload, reason in shapes]
    # Names external storage, which the SDK would try to fetch (and, with none configured, raise).
    stored = [
        ("external storage reference", Payload(metadata={"encoding": b"json/external-storage-reference"},
                                               data=b'{"driver_name": "s3", "key": "x"}'), "external storage"),
        ("external storage marker", Payload(metadata={"encoding": b"json/plain",
                                                      "__temporal_external_storage_reference": b"true"},
                                            data=garbage), "external storage"),
    ]
    return unkeyed + stored


@pytest.mark.parametrize("keyed", [True, False], ids=["worker key set", "worker key unset"])
async def test_undecodable_signals_and_updates_are_recorded_and_the_task_still_pays_once(
    keyed: bool, client: Client, settings: Settings, world: World,
):
    key = new_key() if keyed else None
    strict = settings.model_copy(update={"approval_ceiling_cents": 10000,
                                         "payload_encryption_key": SecretStr(key) if key else None})
    product = await connection.connect(strict)  # the product's client: its data converter and codec
    raw = client  # no codec: what it sends reaches Temporal exactly as written
    async with build_worker(product, strict):
        handle = await start(product, strict, scenario_task("SU-88421"))
        intent_key = (await waiting(handle)).waiting_for.intent_key
        forged = await _forged(key, signed(handle.id, intent_key, "approve"))
        sender = raw.get_workflow_handle(handle.id)
        for what, payload, _ in forged:
            await sender.signal("resolve", RawValue(payload))
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                async with asyncio.timeout(30):  # a task whose workflow task fails never answers
                    await sender.execute_update("decide", RawValue(payload))
            # The validator answers the sender (its message encrypted when the worker has a key) and
            # nothing reaches the history; a signal is recorded as not a decision.
            cause = refused.value.cause
            assert isinstance(cause, ApplicationError) and cause.type == "ValueError", (what, cause)
            if not keyed:
                assert "undecodable_payload" in cause.message, (what, cause)

        async def all_recorded():
            cp = await checkpoint(handle)
            return cp if sum(cp.decision_counts.values()) == len(forged) else None
        cp = await wait_for(all_recorded, "every undecodable signal to be recorded", 30)
        assert cp.state == "awaiting_human" and cp.decision_counts == {"ignored": len(forged)}
        assert Counter((d.via, json.loads(d.raw)["undecodable_payload"]) for d in cp.decisions) == Counter(
            ("signal", reason) for _, _, reason in forged)
        assert all("undecodable_payload" in d.why for d in cp.decisions)
        history = await handle.fetch_history()
        assert not [e for e in history.events if e.HasField("workflow_execution_update_accepted_event_attributes")]
        assert world.refunds("SU-88421") == []

        await handle.signal("resolve", signed(handle.id, intent_key, "approve"))
        result = await finished(handle)
    assert result.state == "completed"
    assert result.checkpoint.decision_counts == {"ignored": len(forged), "applied": 1}
    assert [r["amount_cents"] for r in world.refunds("SU-88421")] == [11800]
    history = await handle.fetch_history()
    failed = [e for e in history.events if e.HasField("workflow_task_failed_event_attributes")]
    assert failed == [], failed[0].workflow_task_failed_event_attributes.failure.message


# --- the codec alone -------------------------------------------------------------------------


def _reason(payload: Payload) -> str:
    assert payload.metadata["encoding"] == UNDECODABLE
    return json.loads(payload.data)["undecodable_payload"]


async def test_the_codec_refuses_each_bad_payload_where_it_stands():
    key = new_key()
    codec = data_converter(key).payload_codec
    good = _json({"intent_key": "k"})
    bad = [
        (Payload(metadata={"encoding": ENCODING}, data=b"garbage"), "unknown key id"),
        (Payload(metadata={"encoding": ENCODING, "encryption-key-id": b"\xff\xfe" * 5000}, data=b"x"),
         "unknown key id"),
        (Payload(metadata={"encoding": ENCODING, "encryption-key-id": KEY_ID.encode()}, data=b"garbage" * 9),
         "wrong key"),
        (Payload(metadata={"encoding": ENCODING, "encryption-key-id": KEY_ID.encode()}, data=b""), "wrong key"),
        ((await EncryptionCodec(base64.b64decode(new_key())).encode([good]))[0], "wrong key"),
        (_sealed(key, b"\xff\xff not a protobuf"), "not a payload"),
    ]
    [sealed_good] = await codec.encode([good])
    decoded = await codec.decode([sealed_good, *(p for p, _ in bad), good])
    assert decoded[0] == good and decoded[-1] == good, "the readable ones around them still decode"
    assert [_reason(p) for p in decoded[1:-1]] == [reason for _, reason in bad]
    assert all(len(p.data) < 100 for p in decoded[1:-1]), "short, and nothing of the sender's echoed"

    no_key = data_converter(None).payload_codec
    decoded = await no_key.decode([sealed_good, good])
    assert _reason(decoded[0]) == "key not set" and decoded[1] == good


class _Typed(BaseModel):
    intent_key: str


@pytest.mark.parametrize("key", ["missing", "wrong"])
async def test_a_refused_payload_is_a_raw_value_to_handlers_and_a_key_error_to_typed_readers(key: str):
    """What the workflow's dynamic handlers see, and what the starter reports (one line, exit 2)."""
    [sealed] = await data_converter(new_key()).encode([_Typed(intent_key="k")])
    reader = data_converter(None if key == "missing" else new_key())
    [raw] = await reader.decode([sealed], [RawValue])
    assert isinstance(raw, RawValue) and _reason(raw.payload) in ("key not set", "wrong key")
    with pytest.raises(PayloadKeyError, match="PAYLOAD_ENCRYPTION_KEY"):
        await reader.decode([sealed], [_Typed])


def test_each_payload_converter_the_sdk_builds_reads_the_marker_with_one_shared_set_of_converters():
    """The SDK builds a payload converter for every workflow run and two for every activation: each reads
    the marker, and all share pydantic's converter, whose cache of type adapters is then built once."""
    first, second = (data_converter(key).payload_converter_class() for key in (None, new_key()))
    assert first.converters.keys() == second.converters.keys() and UNDECODABLE in first.converters
    assert all(first.converters[encoding] is second.converters[encoding] for encoding in first.converters)
    with pytest.raises(PayloadKeyError, match="PAYLOAD_ENCRYPTION_KEY"):
        second.from_payloads([marker("key not set")], [_Typed])


async def test_the_codec_server_answers_a_bad_payload_with_its_marker():
    key = new_key()
    codec = EncryptionCodec(base64.b64decode(key))
    [sealed] = await codec.encode([_json({"task_id": "t"})])
    forged = Payload(metadata={"encoding": ENCODING, "encryption-key-id": KEY_ID.encode()}, data=b"garbage")
    runner = web.AppRunner(codec_app(codec))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        body = json_format.MessageToJson(Payloads(payloads=[sealed, forged]))
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://127.0.0.1:{port}/decode", data=body) as resp:
                assert resp.status == 200, await resp.text()
                decoded = json_format.Parse(await resp.text(), Payloads())
    finally:
        await runner.cleanup()
    assert json.loads(decoded.payloads[0].data) == {"task_id": "t"}
    assert _reason(decoded.payloads[1]) == "wrong key"


async def test_a_compressed_payload_opens_only_whole_and_within_the_limit():
    """What a holder of the key could still seal (another deployment's worker, a leaked key): a bomb that
    opens to more than any payload of ours, a cut or padded stream, bytes that are not compressed at all.
    Each is refused alone, with the bytes it would have opened to never held."""
    key = new_key()
    codec = data_converter(key).payload_codec
    transcript = _json({"messages": [{"role": "tool", "content": "refund performed " * 200}]})
    stream = zlib.compress(transcript.SerializeToString())
    bomb = Payload(metadata={"encoding": b"json/plain"}, data=b"0" * PLAIN_LIMIT).SerializeToString()
    bad = [COMPRESSED + zlib.compress(bomb), COMPRESSED + stream[:-4],
           COMPRESSED + stream + b"more", COMPRESSED + b"not a compressed stream", COMPRESSED]
    decoded = await codec.decode([_sealed(key, COMPRESSED + stream), *(_sealed(key, b) for b in bad)])
    assert decoded[0] == transcript
    assert [_reason(p) for p in decoded[1:]] == ["not a payload"] * len(bad)


async def test_large_payloads_are_compressed_before_they_are_encrypted_and_older_ones_still_open():
    key = new_key()
    codec = data_converter(key).payload_codec
    transcript = _json({"messages": [{"role": "tool", "content": f"refund {n} performed"} for n in range(100)]})
    small = _json({"intent_key": "k"})
    [sealed, sealed_small] = await codec.encode([transcript, small])
    assert len(sealed.data) < len(transcript.SerializeToString()) / 3
    assert len(sealed_small.data) == len(small.SerializeToString()) + 28  # nonce and tag: not worth compressing
    written_before = _sealed(key, transcript.SerializeToString())  # this codec's layout before compression
    assert await codec.decode([sealed, sealed_small, written_before]) == [transcript, small, transcript]

    # PAYLOAD_COMPRESSION=false: lengths that say nothing of the content, and what was compressed still opens.
    settings = Settings(payload_encryption_key=SecretStr(key), payload_compression=False)
    uncompressed = connection.converter_for(settings).payload_codec
    assert uncompressed is not None
    [plain_sealed] = await uncompressed.encode([transcript])
    assert len(plain_sealed.data) == len(transcript.SerializeToString()) + 28
    assert await uncompressed.decode([sealed, plain_sealed]) == [transcript, transcript]
