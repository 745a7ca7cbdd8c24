"""Model provider stubs for tests: no network, the real SDKs over HTTP on 127.0.0.1.

`OpenAIStub` serves `POST /v1/chat/completions`, `AnthropicStub` serves `POST /v1/messages`;
each replays the replies a test queues, in order, and records every request body and header.
"""

from tests.stubs._server import Reply, Request, StubServer
from tests.stubs.anthropic_messages import AnthropicStub
from tests.stubs.openai_chat import OpenAIStub

__all__ = ["AnthropicStub", "OpenAIStub", "Reply", "Request", "StubServer"]
