"""Real model backends behind the provider-neutral `ModelBackend` interface (activities/model.py).

- `activities.backends.openai_chat.OpenAIChatBackend`: OpenAI-compatible Chat Completions
  (OpenAI, vLLM, Ollama, llama.cpp) through the `openai` SDK.
- `activities.backends.anthropic_messages.AnthropicMessagesBackend`: Anthropic Messages through
  the `anthropic` SDK.

Each SDK is imported only by its own module, so a worker on the scripted model loads neither.
How provider failures become activity failures: `activities/backends/_errors.py`.
"""

from activities.backends._errors import (
    RATE_LIMITED,
    REJECTED,
    UNAVAILABLE,
    UNUSABLE,
    ModelConfigError,
)

__all__ = ["RATE_LIMITED", "REJECTED", "UNAVAILABLE", "UNUSABLE", "ModelConfigError"]
