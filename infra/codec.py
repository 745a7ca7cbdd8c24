"""Encrypted payloads: transcripts hold customer data, so workflow and activity payloads are
encrypted (AES-256-GCM) before they reach Temporal, with a key from the environment; so are failure messages and stack traces.

    PAYLOAD_ENCRYPTION_KEY=$(python -m infra.codec new-key)    # 32 random bytes, base64
    python -m infra.codec serve --port 8888                     # codec server for the Web UI

The codec server implements Temporal's remote codec protocol (POST /encode, /decode) so that
the Web UI, started with --ui-codec-endpoint, shows decrypted payloads to operators. It listens
on 127.0.0.1 only; the key never leaves the worker, the starter and this server.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import os
import secrets
import sys
from typing import Iterable, Sequence

from aiohttp import web
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload
from temporalio.api.common.v1 import Payloads as _Payloads
from temporalio.converter import DataConverter, DefaultFailureConverterWithEncodedAttributes, PayloadCodec
from temporalio.contrib.pydantic import pydantic_data_converter

ENCODING = b"binary/encrypted"
KEY_ID = "agent-payloads-v1"


class EncryptionCodec(PayloadCodec):
    def __init__(self, key: bytes, key_id: str = KEY_ID) -> None:
        if len(key) != 32:
            raise ValueError("PAYLOAD_ENCRYPTION_KEY must be 32 bytes, base64-encoded")
        self._aead = AESGCM(key)
        self._key_id = key_id

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [Payload(metadata={"encoding": ENCODING, "encryption-key-id": self._key_id.encode()},
                        data=self._encrypt(p.SerializeToString())) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for payload in payloads:
            if payload.metadata.get("encoding") != ENCODING:
                out.append(payload)
                continue
            key_id = payload.metadata.get("encryption-key-id", b"").decode()
            if key_id != self._key_id:
                raise ValueError(f"payload was encrypted with key {key_id!r}, not {self._key_id!r}")
            decoded = Payload()
            decoded.ParseFromString(self._decrypt(payload.data))
            out.append(decoded)
        return out

    def _encrypt(self, data: bytes) -> bytes:
        nonce = secrets.token_bytes(12)
        return nonce + self._aead.encrypt(nonce, data, None)

    def _decrypt(self, data: bytes) -> bytes:
        return self._aead.decrypt(data[:12], data[12:], None)


def key_from(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as err:
        raise ValueError("PAYLOAD_ENCRYPTION_KEY is not valid base64") from err


def data_converter(key: str | None) -> DataConverter:
    """The one data converter: pydantic, plus encryption when a key is configured.

    With a key, failures' messages and stack traces are moved into an encoded payload too (a
    provider's error may echo a prompt, a customer's name, an address), so the server and its
    histories see only "Encoded failure".
    """
    if not key:
        return pydantic_data_converter
    return dataclasses.replace(pydantic_data_converter, payload_codec=EncryptionCodec(key_from(key)),
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

    def handler(encode: bool):
        async def handle(request: web.Request) -> web.StreamResponse:
            if request.method == "OPTIONS":
                return cors(request, web.Response())
            try:
                body = json_format.Parse(await request.text(), _Payloads())
            except json_format.ParseError as err:
                return cors(request, web.json_response({"error": f"not a payloads JSON: {err}"}, status=400))
            try:
                payloads = await (codec.encode if encode else codec.decode)(list(body.payloads))
            except Exception as err:  # a payload we cannot decrypt: say so, never crash the server
                return cors(request, web.json_response({"error": str(err)}, status=400))
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
    serve.add_argument("--ui-origin", action="append", default=None)
    args = parser.parse_args(argv)
    if args.command == "new-key":
        print(base64.b64encode(secrets.token_bytes(32)).decode())
        return 0
    try:
        codec = EncryptionCodec(key_from(os.environ.get("PAYLOAD_ENCRYPTION_KEY", "")))
    except ValueError as err:
        print(f"codec: {err}", file=sys.stderr)
        return 2
    origins = args.ui_origin or ["http://127.0.0.1:8233", "http://localhost:8233"]
    web.run_app(codec_app(codec, origins), host="127.0.0.1", port=args.port, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
