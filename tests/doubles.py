"""Test doubles shared by tests: a deterministic chat model and a policy with fixed reuse probabilities
(real classes, not mocks)."""

from __future__ import annotations

from historygraph.models.chat import Completion
from historygraph.policies import config_fields, create, names


class ScriptedModel:
    """A :class:`~historygraph.models.chat.ChatModel` that answers from a script.

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
    """A deterministic :class:`~historygraph.models.chat.ChatModel`: answers ``"summary #<n>"`` and records
    every prompt. Usage per call: 10 input tokens per message, ``min(5, max_tokens)`` output
    tokens, 0.25 s."""

    name = "counting-test-model"

    def __init__(self) -> None:
        self.prompts: list[list[dict[str, str]]] = []

    def complete(self, messages: list[dict[str, str]], max_tokens: int = 256) -> Completion:
        self.prompts.append(messages)
        return Completion(f"summary #{len(self.prompts)}", 10 * len(messages), min(5, max_tokens), 0.25)


class TableScorer:
    """A deterministic :class:`~historygraph.signals.perplexity.TokenScorer`: tokens are words (a run
    of non-space characters with the spaces before it); a token's NLL is ``table[word]`` (nats),
    else a value in 1.0..4.5 from the word's sha256; a word that also occurs in the context scores
    ``context_bonus`` lower. Each ``score`` call is recorded in ``calls`` and reports
    ``tokens(context) + tokens(text) + 1`` input tokens and ``seconds`` seconds."""

    name = "table-test-scorer"

    def __init__(self, table: dict[str, float] | None = None, context_bonus: float = 1.0, seconds: float = 0.0) -> None:
        self.table = dict(table or {})
        self.context_bonus, self.seconds = context_bonus, seconds
        self.calls: list[tuple[str, str]] = []

    def tokenize(self, text):
        import re

        return [(m.start(), m.end()) for m in re.finditer(r"\s*\S+", text)]

    def value(self, word: str) -> float:
        import hashlib

        if word in self.table:
            return self.table[word]
        return 1.0 + hashlib.sha256(word.encode("utf-8", "surrogatepass")).digest()[0] % 8 / 2

    def score(self, text, context=""):
        import numpy as np

        from historygraph.signals.perplexity import Scored

        self.calls.append((text, context))
        spans = self.tokenize(text)
        seen = {context[a:b].strip() for a, b in self.tokenize(context)}
        nll = np.array([self.value(w) - (self.context_bonus if w in seen else 0.0)
                        for w in (text[a:b].strip() for a, b in spans)], dtype=np.float64)
        return Scored(spans, nll, len(spans) + len(seen) + 1, self.seconds)


def _uses_attention_model(name: str) -> bool:
    """ReCAP variants whose proxy attention runs the local SmolLM2-135M model (not model-free)."""
    cfg = config_fields(name)
    return cfg.get("attention") == "proxy" and cfg.get("use_graph", True)


MODEL_FREE = [n for n in names() if not _uses_attention_model(n)]
"""Every registered policy but the ReCAP variants that run the local language model."""


class RankedPrune:
    """prune, with fixed reuse probabilities by position (``prob``; 0 for the rest): a wrapped policy
    that gives ``reuse_probabilities`` without a fitted model (policies/cache_stable.py)."""

    name = "prune"

    def __init__(self, prob: dict[int, float]) -> None:
        self.inner, self.prob = create("prune"), prob

    def render(self, graph, budget, signals):  # noqa: ANN001, ANN201 - the Policy protocol
        return self.inner.render(graph, budget, signals)

    def reuse_probabilities(self, graph, positions, signals):  # noqa: ANN001, ANN201
        return [self.prob.get(p, 0.0) for p in positions]
