"""Connecting to Temporal the same way everywhere: the local dev server, a cluster, or Temporal Cloud.

One data converter for all (pydantic, plus payload encryption when PAYLOAD_ENCRYPTION_KEY is
set). For Temporal Cloud set TEMPORAL_ADDRESS (<namespace>.<account>.tmprl.cloud:7233),
TEMPORAL_NAMESPACE (<namespace>.<account>), and either TEMPORAL_API_KEY or
TEMPORAL_TLS_CERT and TEMPORAL_TLS_KEY (paths to the client certificate and key, mTLS).
"""

from __future__ import annotations

from typing import Sequence

from temporalio.client import Client, Interceptor
from temporalio.runtime import Runtime
from temporalio.service import TLSConfig

from infra.codec import data_converter
from infra.settings import Settings


def tls_config(settings: Settings) -> TLSConfig | bool:
    if settings.temporal_tls_cert and settings.temporal_tls_key:
        return TLSConfig(client_cert=settings.temporal_tls_cert.read_bytes(),
                         client_private_key=settings.temporal_tls_key.read_bytes())
    return settings.temporal_api_key is not None


async def connect(settings: Settings, runtime: Runtime | None = None,
                  interceptors: Sequence[Interceptor] = ()) -> Client:
    key = settings.payload_encryption_key.get_secret_value() if settings.payload_encryption_key else None
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=data_converter(key),
        tls=tls_config(settings),
        api_key=settings.temporal_api_key.get_secret_value() if settings.temporal_api_key else None,
        runtime=runtime,
        interceptors=interceptors,
    )
