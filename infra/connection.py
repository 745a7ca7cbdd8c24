"""Connecting to Temporal the same way everywhere: the local dev server, a cluster, or Temporal Cloud.

Where to connect comes from Temporal's own environment configuration (`temporalio.envconfig`), the
one the `temporal` CLI and every SDK read: the variables TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE,
TEMPORAL_API_KEY, TEMPORAL_TLS, TEMPORAL_TLS_CLIENT_CERT_PATH, TEMPORAL_TLS_CLIENT_KEY_PATH,
TEMPORAL_TLS_SERVER_CA_CERT_PATH, TEMPORAL_TLS_SERVER_NAME, and profiles of a TOML file
(TEMPORAL_CONFIG_FILE, TEMPORAL_PROFILE). An address or namespace given in Settings wins (tests set
them); without any, the local dev server at 127.0.0.1:7233, namespace `default`.

One data converter for all (pydantic, plus payload encryption when PAYLOAD_ENCRYPTION_KEY is set).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temporalio.client import Client, Interceptor
from temporalio.converter import DataConverter
from temporalio.envconfig import ClientConfigProfile
from temporalio.runtime import Runtime

from infra.codec import data_converter
from infra.settings import Settings

DEFAULT_ADDRESS = "127.0.0.1:7233"
DEFAULT_NAMESPACE = "default"


def connect_options(settings: Settings) -> dict[str, Any]:
    """Client.connect's options from the environment configuration, with Settings' address and namespace over it.

    Raises ValueError for a configuration that cannot be read (a missing profile, a bad file).
    """
    try:
        options: dict[str, Any] = dict(ClientConfigProfile.load().to_client_connect_config())
    except Exception as err:  # the bridge raises RuntimeError/ValueError with the reason
        raise ValueError(f"Temporal connection configuration: {str(err).splitlines()[0]}") from None
    options["target_host"] = settings.temporal_address or options.get("target_host") or DEFAULT_ADDRESS
    options["namespace"] = settings.temporal_namespace or options.get("namespace") or DEFAULT_NAMESPACE
    return options


def _option(settings: Settings, name: str, fallback: str) -> str:
    try:
        value: str = connect_options(settings)[name]
        return value
    except ValueError:
        return fallback


def address(settings: Settings) -> str:
    """Where we connect, for messages (never raises)."""
    return _option(settings, "target_host", settings.temporal_address or DEFAULT_ADDRESS)


def namespace(settings: Settings) -> str:
    """The namespace we use, for messages and links (never raises)."""
    return _option(settings, "namespace", settings.temporal_namespace or DEFAULT_NAMESPACE)


async def connect(settings: Settings, runtime: Runtime | None = None,
                  interceptors: Sequence[Interceptor] = ()) -> Client:
    options = connect_options(settings)
    return await Client.connect(**options, data_converter=converter_for(settings), runtime=runtime,
                                interceptors=interceptors)


def converter_for(settings: Settings) -> DataConverter:
    """The settings' data converter: encrypted with their key, if any, and compressed unless they say not."""
    key = settings.payload_encryption_key.get_secret_value() if settings.payload_encryption_key else None
    return data_converter(key, settings.payload_compression)
