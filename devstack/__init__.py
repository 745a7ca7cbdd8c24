"""Process management for the local stack (Temporal dev server, localstripe, workers).

Used by the Makefile (`python -m devstack up|down|status`), by the demo and by
pytest fixtures. Imports only the standard library.
"""

from devstack.processes import (
    ConfigError,
    LocalStripe,
    ManagedProcess,
    StackError,
    StartupError,
    TemporalDevServer,
    WorkerProcess,
    free_port,
)
from devstack.stack import Stack

__all__ = [
    "ConfigError",
    "LocalStripe",
    "ManagedProcess",
    "Stack",
    "StackError",
    "StartupError",
    "TemporalDevServer",
    "WorkerProcess",
    "free_port",
]
