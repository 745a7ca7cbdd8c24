"""Encrypted payloads: transcripts hold customer data, so workflow and activity payloads are
encrypted (AES-256-GCM) before they reach Temporal, with a key from the environment; so are failure
messages and stack traces. A payload is compressed before it is encrypted when that makes it shorter.

    PAYLOAD_ENCRYPTION_KEY=$(python -m infra.codec new-key)    # 32 random bytes, base64
    python -m infra.codec serve --port 8888                     # codec server for the Web UI

The codec server implements Temporal's remote codec protocol (POST /encode, /decode) so that
the Web UI, started with --ui-codec-endpoint, shows decrypted payloads to operators. It listens
on 127.0.0.1 only (`--host 0.0.0.0` inside a container: docker-compose.yml); the key never leaves the
worker, the starter and this server.

A payload that cannot be decoded (no key here, another key or key id, garbage) is never raised
while decoding: anyone who may signal a task can write `binary/encrypted` metadata, and a raise
while the SDK decodes an activation fails the workflow task before any handler runs, on every
retry, so the task would answer nothing again. Instead that one payload becomes a marker
(`json/undecodable`, `{"undecodable_payload": "<reason>"}`): the workflow's dynamic handlers read
their RawValue as bytes and record it as not a decision; reading it as a typed value raises
PayloadKeyError with the reason (the starter's one line about the key); the codec server shows it.

The same holds for a payload that names external storage (encoding `json/external-storage-reference`
or the `__temporal_external_storage_reference` marker): this deployment stores no payload outside
Temporal, and the SDK, meeting one with no storage configured, raises while decoding the activation.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import functools
import json
import os
import secrets
import sys
import zlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from aiohttp import web
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from temporalio.api.common.v1 import Payload
from temporalio.api.common.v1 import Payloads as _Payloads
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultFailureConverterWithEncodedAttributes,
    EncodingPayloadConverter,
    PayloadCodec,
)

ENCODING = b"binary/encrypted"
KEY_ID = "agent-payloads-v1"
UNDECODABLE = b"json/undecodable"
# Why a payload was refused, short enough to show whole in the workflow's record of it; and what a
# typed reader is told. A reason not listed here (a sender may forge a marker too) is not echoed.
_REASONS = {
    "key not set": "the task's payloads are encrypted and PAYLOAD_ENCRYPTION_KEY is not set: export the worker's key",
    "unknown key id": f"a payload was encrypted with another key id than {KEY_ID!r}: use the worker's key",
    "wrong key": "the task's payloads were encrypted with another key than PAYLOAD_ENCRYPTION_KEY: "
                 "use the worker's key",
    "not a payload": "a payload decrypted with PAYLOAD_ENCRYPTION_KEY is not a Temporal payload",
    "external storage": "a payload names external storage, which this deployment does not use",
}
# A payload is compressed before it is encrypted when that makes it shorter: a task's model-turn inputs carry
# its transcript, and the server's CPU per task grows with the bytes of its history (docs/figures.md). The
# compressed plaintext starts with a zero byte, which a serialized Payload never does (field 0 does not
# exist), so ciphertexts written before read as they did; the mark is inside the ciphertext, so nobody
# without the key can set or clear it. Compressed, a payload's length depends on what it says:
# PAYLOAD_COMPRESSION=false where someone who reads the history's sizes may also write text into tasks.
COMPRESSED = b"\x00"
COMPRESS_FROM = 256  # bytes of a serialized payload: shorter ones seldom shrink
# The most a compressed payload opens to, twice the 2 MiB Temporal takes in one payload; none larger is compressed.
PLAIN_LIMIT = 4 << 20
_REFERENCE_ENCODING = b"json/external-storage-reference"
_REFERENCE_MARKER = "__temporal_external_storage_reference"


class PayloadKeyError(ValueError):
    """An encrypted payload that this process cannot read: no key, or not the key it was encrypted with."""


def refused(reason: str) -> Payload:
    """The marker that stands in for a payload this process cannot decode."""
    return Payload(metadata={"encoding": UNDECODABLE},
                   data=json.dumps({"undecodable_payload": reason}).encode())


class _UndecodablePayloadConverter(EncodingPayloadConverter):
    """Reads the marker as a typed value: raises PayloadKeyError with its reason. Never writes one."""

    @property
    def encoding(self) -> str:
        return UNDECODABLE.decode()

    def to_payload(self, value: Any) -> Payload | None:
        return None

    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        try:
            reason = json.loads(payload.data)["undecodable_payload"]
        except (ValueError, TypeError, KeyError, RecursionError):
            reason = None
        raise PayloadKeyError(_REASONS.get(str(reason), "a payload could not be decoded"))


class _PayloadConverter(CompositePayloadConverter):
    """Pydantic's converters, plus the marker's reader.

    The SDK builds a payload converter for every workflow run and two for every activation (one to decode
    its jobs, one to encode its commands). Ours all hold the same converters, built once: pydantic's
    serializer, and with it its cache of type adapters, which each run's own copy built again for every
    type it decoded."""

    def __init__(self) -> None:
        super().__init__(*_converters())


@functools.cache
def _converters() -> tuple[EncodingPayloadConverter, ...]:
    return (*PydanticPayloadConverter().converters.values(), _UndecodablePayloadConverter())


class EncryptionCodec(PayloadCodec):
    """`compress`: compress what it encrypts where that is shorter (a compressed payload opens either way)."""

    def __init__(self, key: bytes, key_id: str = KEY_ID, compress: bool = True) -> None:
        if len(key) != 32:
            raise ValueError("PAYLOAD_ENCRYPTION_KEY must be 32 bytes, base64-encoded")
        self._aead = AESGCM(key)
        self._key_id = key_id
        self._compress = compress

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [Payload(metadata={"encoding": ENCODING, "encryption-key-id": self._key_id.encode()},
                        data=self._encrypt(self._plain(p))) for p in payloads]

    def _plain(self, payload: Payload) -> bytes:
        plain = payload.SerializeToString()
        return _deflated(plain) if self._compress else plain

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for payload in payloads:
            if payload.metadata.get("encoding") != ENCODING:
                out.append(payload)
                continue
            out.append(self._open(payload))
        return out

    def _open(self, payload: Payload) -> Payload:
        """The payload inside, or the marker saying why not: never raises (see the module's docstring)."""
        if payload.metadata.get("encryption-key-id") != self._key_id.encode():
            return refused("unknown key id")
        try:
            plain = self._decrypt(payload.data)
        except (InvalidTag, ValueError):  # ValueError: too short to hold a nonce
            return refused("wrong key")
        if plain[:1] == COMPRESSED:
            opened = _inflated(plain[1:])
            if opened is None:
                return refused("not a payload")
            plain = opened
        decoded = Payload()
        try:
            decoded.ParseFromString(plain)
        except DecodeError:
            return refused("not a payload")
        return decoded

    def _encrypt(self, data: bytes) -> bytes:
        nonce = secrets.token_bytes(12)
        return nonce + self._aead.encrypt(nonce, data, None)

    def _decrypt(self, data: bytes) -> bytes:
        return self._aead.decrypt(data[:12], data[12:], None)


def _deflated(plain: bytes) -> bytes:
    """The plaintext to encrypt: compressed and marked when that is shorter."""
    if not COMPRESS_FROM <= len(plain) <= PLAIN_LIMIT:
        return plain
    packed = COMPRESSED + zlib.compress(plain, 1)  # level 1: 3% larger than 6 on a ticket's payloads, 10% faster
    return packed if len(packed) < len(plain) else plain


def _inflated(packed: bytes) -> bytes | None:
    """The compressed plaintext opened, or None when it is not whole, runs past PLAIN_LIMIT (which no
    encoder of ours writes) or has bytes after its end."""
    inflater = zlib.decompressobj()
    try:
        plain = inflater.decompress(packed, PLAIN_LIMIT)
    except zlib.error:
        return None
    return plain if inflater.eof and not inflater.unconsumed_tail and not inflater.unused_data else None


def new_key() -> str:
    """A new random key, as PAYLOAD_ENCRYPTION_KEY holds it (base64 of 32 bytes)."""
    return base64.b64encode(secrets.token_bytes(32)).decode()


def key_from(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as err:
        raise ValueError("PAYLOAD_ENCRYPTION_KEY is not valid base64") from err


class _NoKeyCodec(PayloadCodec):
    """Without a key: payloads pass as they are, and an encrypted one is refused with the reason."""

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [refused("key not set") if p.metadata.get("encoding") == ENCODING else p for p in payloads]


def _names_external_storage(payload: Payload) -> bool:
    return payload.metadata.get("encoding") == _REFERENCE_ENCODING or _REFERENCE_MARKER in payload.metadata


@dataclasses.dataclass(frozen=True)
class _NoExternalStorage(DataConverter):
    """A payload naming external storage is refused as a marker instead of raised while an activation is
    decoded (the SDK's own steps raise before any codec or handler sees it). These two steps are the
    SDK's hooks for external storage, which this deployment never configures;
    tests/test_undecodable_payloads.py sends both shapes to a real worker and fails if the hooks move."""

    async def _decode_reference_payload_sequence(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [refused("external storage") if _names_external_storage(p) else p for p in payloads]

    async def _external_retrieve_payload_sequence(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [refused("external storage") if _names_external_storage(p) else p for p in payloads]


def data_converter(key: str | None, compress: bool = True) -> DataConverter:
    """The one data converter: pydantic, plus encryption when a key is configured.

    With a key, failures' messages and stack traces are moved into an encoded payload too (a
    provider's error may echo a prompt, a customer's name, an address), so the server and its
    histories see only "Encoded failure". Without one, an encrypted payload is refused with the reason.
    Either way a payload that cannot be decoded is refused alone, as a marker (the module's docstring).
    """
    converter = _NoExternalStorage(payload_converter_class=_PayloadConverter)
    if not key:
        return dataclasses.replace(converter, payload_codec=_NoKeyCodec())
    return dataclasses.replace(converter, payload_codec=EncryptionCodec(key_from(key), compress=compress),
                               failure_converter_class=DefaultFailureConverterWithEncodedAttributes)


def codec_app(codec: PayloadCodec, allowed_origins: Iterable[str] = ("http://127.0.0.1:8233",
                                                                     "http://localhost:8233")) -> web.Application:
    origins = set(allowed_origins)

    def cors(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin in origins:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Allow-Methods"] = "POST, OPTIONS"
            response.headers["Access-Control-Allow-Headers"] = "content-type, x-namespace, authorization"
            response.headers["Access-Control-Allow-Credentials"] = "true"
        return response

    def handler(encode: bool) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            if request.method == "OPTIONS":
                return cors(request, web.Response())
            try:
                body = json_format.Parse(await request.text(), _Payloads())
            except json_format.ParseError as err:
                return cors(request, web.json_response({"error": f"not a payloads JSON: {err}"}, status=400))
            # One payload the codec cannot decode comes back as its marker, the others decoded.
            payloads = await (codec.encode if encode else codec.decode)(list(body.payloads))
            out = _Payloads(payloads=payloads)
            return cors(request, web.Response(text=json_format.MessageToJson(out), content_type="application/json"))
        return handle

    app = web.Application()
    for path, encode in (("/encode", True), ("/decode", False)):
        app.router.add_route("POST", path, handler(encode))
        app.router.add_route("OPTIONS", path, handler(encode))
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="payload encryption for Temporal")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("new-key", help="print a new random key")
    serve = sub.add_parser("serve", help="run the codec server for the Web UI")
    serve.add_argument("--port", type=int, default=8888)
    serve.add_argument("--host", default="127.0.0.1", help="127.0.0.1 unless inside a container")
    serve.add_argument("--ui-origin", action="append", default=None)
    args = parser.parse_args(argv)
    if args.command == "new-key":
        print(new_key())
        return 0
    try:
        codec = EncryptionCodec(key_from(os.environ.get("PAYLOAD_ENCRYPTION_KEY", "")))
    except ValueError as err:
        print(f"codec: {err}", file=sys.stderr)
        return 2
    origins = args.ui_origin or ["http://127.0.0.1:8233", "http://localhost:8233"]
    web.run_app(codec_app(codec, origins), host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
