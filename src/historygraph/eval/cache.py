"""Prefix-cache reuse: the share of a prompt a provider's prefix cache could serve.

Providers cache the longest prefix a prompt shares with an earlier one (OpenAI and Anthropic
prompt caching both match exact leading tokens). For invocation ``t`` of one policy on one trace,
the *cached* tokens are the leading tokens of its complete model input ``S_t`` (tool schemas,
system prompt, rendered history, current message) that equal the leading tokens of the previous
invocation's input ``S_{t-1}``; the first invocation has none. A policy's measured cache fraction
on a trace is ``ρ = Σ_t cached_t / Σ_t |S_t|`` (token-weighted, so it is what eq. 3 of ContextRender,
arXiv 2609.37743 §4.2, needs). Full history appends at the end, so its ρ is close to 1; a policy
that re-selects results at every call (ContextRender) changes the prompt early and shares less;
one that keeps its selection within a user turn (ReCAP §3) shares more.

Matching is per message, then per token: messages equal to their counterpart in ``S_{t-1}`` count
whole (:meth:`TokenCounter.count_message`); at the first message that differs, a message of the
same role counts its overhead, the common leading tokens of its content, and, when the contents are
equal, its equal leading tool calls. Nothing after the first difference counts. Provider cache
granularity (e.g. 128-token blocks) is not modelled: the figure is an upper bound on what a cache
serves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from historygraph.history.events import Message
from historygraph.signals.tokens import MESSAGE_OVERHEAD, TokenCounter


def _common_ids(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def equal_leading(previous: Sequence[Message], current: Sequence[Message]) -> int:
    """How many leading messages of ``current`` equal those of ``previous``."""
    n = 0
    for a, b in zip(previous, current):
        if a is not b and a != b:  # the same object: equal without comparing its fields
            break
        n += 1
    return n


def differing_message_tokens(a: Message, b: Message, counter: TokenCounter,
                             encode: Callable[[str], list[int]] | None = None) -> int:
    """Tokens of ``b`` equal to a prefix of ``a`` when ``a`` and ``b`` are the first pair of messages
    that differ (module docstring): 0 across roles; else the overhead, the common leading tokens of
    the contents and, when the contents are equal, the equal leading tool calls. ``encode``: the
    tokenizer to use (a memoising one), default ``counter.encode``."""
    if a.role != b.role:
        return 0
    encode = encode or counter.encode
    n = MESSAGE_OVERHEAD + _common_ids(encode(a.content), encode(b.content))
    if a.content == b.content:
        for x, y in zip(a.tool_calls, b.tool_calls):
            if x != y:
                break
            n += counter.count(x.name) + counter.count(x.arguments)
    return n


def shared_prefix_tokens(previous: Sequence[Message], current: Sequence[Message], counter: TokenCounter) -> int:
    """Tokens of ``current`` (counted as :meth:`TokenCounter.count_messages` counts them) that
    equal a prefix of ``previous`` (module docstring); 0 when ``previous`` is empty."""
    k = equal_leading(previous, current)
    n = sum(counter.count_message(m) for m in current[:k])
    if k < min(len(previous), len(current)):
        n += differing_message_tokens(previous[k], current[k], counter)
    return n


@dataclass
class PrefixReuse:
    """Running prefix-cache figures of one policy on one trace: feed each rendering's messages to
    :meth:`observe` in invocation order. ``fixed_prefix`` tokens (tool schemas) lead every prompt
    and are cached from the second invocation on."""

    counter: TokenCounter
    fixed_prefix: int = 0
    cached: int = 0      # Σ cached_t
    prompt: int = 0      # Σ |S_t|
    _previous: list[Message] = field(default_factory=list)
    _seen: bool = False

    def observe(self, messages: Sequence[Message], prompt_tokens: int) -> int:
        """Record one invocation whose input is ``messages`` (``prompt_tokens`` of them, without the
        fixed prefix); returns its cached tokens."""
        hit = (self.fixed_prefix if self._seen else 0) + shared_prefix_tokens(self._previous, messages, self.counter)
        self.cached += hit
        self.prompt += prompt_tokens + self.fixed_prefix
        self._previous = list(messages)
        self._seen = True
        return hit

    def skip(self) -> None:
        """An invocation without a rendering (budget error): the next prompt shares nothing with it."""
        self._previous = []

    @property
    def fraction(self) -> float:
        """``ρ = cached / prompt`` (0 when nothing was observed)."""
        return self.cached / self.prompt if self.prompt else 0.0
