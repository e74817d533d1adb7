"""Test doubles shared by the tests (real subclasses of the protocols, not mocks)."""

from __future__ import annotations

from historygraph.llm import Completion


class ScriptedModel:
    """A deterministic :class:`~historygraph.llm.ChatModel`: answers ``"summary #<n>"`` and records
    every prompt. Usage per call: 10 input tokens per message, ``min(5, max_tokens)`` output
    tokens, 0.25 s."""

    name = "scripted-test-model"

    def __init__(self) -> None:
        self.prompts: list[list[dict[str, str]]] = []

    def complete(self, messages: list[dict[str, str]], max_tokens: int = 256) -> Completion:
        self.prompts.append(messages)
        return Completion(f"summary #{len(self.prompts)}", 10 * len(messages), min(5, max_tokens), 0.25)
