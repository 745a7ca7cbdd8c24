"""What a model may put into a task, bounded where it enters: one pure function, used by the model
activity (so the history records the bounded reply) and again by the workflow (for replies recorded
before the bound, and whatever backend a worker runs).

A reply of any size becomes at most `MAX_TEXT_CHARS` of text and `MAX_TOOL_CALLS` calls whose
arguments together hold at most `MAX_ARGUMENTS_CHARS`: a turn then adds a few tens of KB to the
history and to every later model turn's window, far below Temporal's 2 MB payload limit, whatever
the model (or a server pretending to be one) sends. What was cut is said in the reply, so the
model learns it, and a call whose arguments were cut is rejected by the gate with their size.
"""

from __future__ import annotations

import json

from core.models import ModelReply, ToolCall

MAX_TEXT_CHARS = 8_000
MAX_TOOL_CALLS = 8
MAX_ARGUMENT_CHARS = 20_000  # one call's arguments (the gate rejects a call over it with its size)
MAX_ARGUMENTS_CHARS = 24_000  # all calls of one reply together
MAX_NAME_CHARS = 64
TRUNCATED = "__truncated_characters__"  # the arguments that replace a call's cut ones: {TRUNCATED: size}


def bounded_reply(reply: ModelReply) -> ModelReply:
    """The reply within the bounds above; the same reply when it already is."""
    notes: list[str] = []
    calls: list[ToolCall] = []
    budget = MAX_ARGUMENTS_CHARS
    for call in reply.tool_calls[:MAX_TOOL_CALLS]:
        arguments = call.arguments
        if len(arguments) > min(MAX_ARGUMENT_CHARS, budget):
            arguments = json.dumps({TRUNCATED: len(arguments)})
        budget -= len(arguments)
        if arguments is call.arguments and len(call.id) <= MAX_NAME_CHARS and len(call.name) <= MAX_NAME_CHARS:
            calls.append(call)
        else:
            calls.append(ToolCall(id=call.id[:MAX_NAME_CHARS], name=call.name[:MAX_NAME_CHARS], arguments=arguments))
    if len(reply.tool_calls) > MAX_TOOL_CALLS:
        notes.append(f"[{len(reply.tool_calls) - MAX_TOOL_CALLS} tool calls beyond {MAX_TOOL_CALLS} were dropped]")
    content = reply.content
    if len(content) > MAX_TEXT_CHARS:
        notes.append(f"[{len(content) - MAX_TEXT_CHARS} characters beyond {MAX_TEXT_CHARS} were cut]")
        content = content[:MAX_TEXT_CHARS]
    if not notes and calls == reply.tool_calls and content is reply.content:
        return reply
    return ModelReply(content="\n".join([content, *notes]) if content else "\n".join(notes), tool_calls=calls)

# The transcript window one model turn carries: far below Temporal's 2 MB per payload. (The server's
# payload limit is left at its default: an Update's acceptance or rejection echoes its request, so a
# lower limit than the server enforces on Update requests would fail the workflow task instead.)
MAX_WINDOW_BYTES = 256 * 1024
