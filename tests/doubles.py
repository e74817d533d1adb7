"""Test doubles shared by tests: a deterministic chat model (a real class, not a mock)."""

from __future__ import annotations

from historygraph.llm import Completion


class ScriptedModel:
    """A :class:`~historygraph.llm.ChatModel` that answers from a script.

    ``answers`` is a list of texts returned in turn (the last one repeats); without answers it
    returns ``"note: "`` plus the first ``echo_chars`` characters of the last message's final
    line, so summaries are deterministic and distinct per input. ``calls`` records every request.
    """

    name = "scripted-test-model"

    def __init__(self, answers: list[str] | None = None, echo_chars: int = 40) -> None:
        self.answers = list(answers or [])
        self.echo_chars = echo_chars
        self.calls: list[list[dict[str, str]]] = []

    def complete(self, messages: list[dict[str, str]], max_tokens: int = 256) -> Completion:
        self.calls.append(messages)
        if self.answers:
            text = self.answers[min(len(self.calls), len(self.answers)) - 1]
        else:
            text = "note: " + messages[-1]["content"].strip().splitlines()[-1][:self.echo_chars]
        return Completion(text, sum(len(m["content"]) for m in messages) // 4, len(text) // 4, 0.0)


class CountingModel:
    """A deterministic :class:`~historygraph.llm.ChatModel`: answers ``"summary #<n>"`` and records
    every prompt. Usage per call: 10 input tokens per message, ``min(5, max_tokens)`` output
    tokens, 0.25 s."""

    name = "counting-test-model"

    def __init__(self) -> None:
        self.prompts: list[list[dict[str, str]]] = []

    def complete(self, messages: list[dict[str, str]], max_tokens: int = 256) -> Completion:
        self.prompts.append(messages)
        return Completion(f"summary #{len(self.prompts)}", 10 * len(messages), min(5, max_tokens), 0.25)
