"""The client library: what another program imports to start, follow, decide and redrive tasks.

    client = await connect(settings)
    handle = await start_ticket(client, settings, Ticket(kind="support", ticket_id="T-1001", text=...,
                                                         facts={"order_id": "SU-88421"}))
    result = await follow(handle)

Everything here reads tasks through Temporal; nothing opens the worker's database.
"""

from client.errors import ClientError
from client.facts import check_facts
from client.tasks import (
    checkpoint_of,
    connect,
    decide,
    describe_task,
    follow,
    redrive,
    start_task,
    start_ticket,
    started_now,
)
from client.tickets import Ticket, read_ticket_file

__all__ = ["ClientError", "Ticket", "check_facts", "checkpoint_of", "connect", "decide", "describe_task", "follow",
           "read_ticket_file", "redrive", "start_task", "start_ticket", "started_now"]
