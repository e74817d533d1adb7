"""Token-count calibration against what the provider reports (issue 6, input 10).

Scope of our counts (documented in docs/robustness.md): B caps the *history* only — messages, their tool
calls and results, placeholders — counted with :class:`~historygraph.signals.tokens.TokenCounter`
(content + tool-call names and arguments + 3 tokens per message). The system prompt, the current
user message and the tool schemas are outside B (ContextRender A.4) but are part of what the
provider bills, so :meth:`TokenCalibration.estimate_request` counts all of them for comparison
with the provider's ``usage.prompt_tokens``.

The proxy calls :meth:`observe` for every upstream answer that reports usage, both APIs, streamed
or not (:func:`openai_usage`, :func:`anthropic_usage`); the ratio of reported to estimated tokens
tells how far our counts drift (other tokenizers, hidden formatting), and the proxy renders at
:meth:`adjusted_budget` (``historygraph serve --no-calibration`` turns that off) so renderings stay
within the provider's view of the budget. One ratio per proxy instance: run one instance per
provider to keep their tokenizers apart.
"""

from __future__ import annotations

import bisect
import json
import math
import threading
from dataclasses import dataclass
from typing import Any, Sequence

from historygraph.history.events import Message
from historygraph.signals.tokens import TokenCounter

#: Tokens OpenAI's chat format adds to prime the assistant's reply (published counting recipe).
REPLY_PRIMING = 3


@dataclass(frozen=True)
class Usage:
    """Prompt tokens a provider reported for one answer, kept apart: ``fresh`` (read without a
    cache), ``cache_read`` and ``cache_write`` (prompt-cache hits and writes). ``total`` is what
    the provider counted for the whole prompt."""

    fresh: int
    cache_read: int = 0
    cache_write: int = 0

    @property
    def total(self) -> int:
        return self.fresh + self.cache_read + self.cache_write


def _int(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def openai_usage(obj: Any) -> Usage | None:
    """Usage of a Chat Completions answer or stream chunk (the ``include_usage`` chunk):
    ``usage.prompt_tokens`` includes ``usage.prompt_tokens_details.cached_tokens`` (OpenAI API
    reference, "The chat completion object"); OpenAI reports no cache writes."""
    u = obj.get("usage") if isinstance(obj, dict) else None
    if not isinstance(u, dict) or not isinstance(u.get("prompt_tokens"), int):
        return None
    cached = _int((u.get("prompt_tokens_details") or {}).get("cached_tokens"))
    return Usage(max(0, u["prompt_tokens"] - cached), cached, 0)


def anthropic_usage(obj: Any, previous: Usage | None = None) -> Usage | None:
    """Usage of a Messages API answer, or of a stream's ``message_start`` (``message.usage``) and
    ``message_delta`` (``usage``, whose input fields, when present, replace the earlier ones):
    ``input_tokens`` (not cached), ``cache_read_input_tokens``, ``cache_creation_input_tokens``
    (Anthropic API reference, "Messages", usage)."""
    if not isinstance(obj, dict):
        return previous
    u = obj.get("usage")
    if not isinstance(u, dict) and isinstance(obj.get("message"), dict):
        u = obj["message"].get("usage")
    if not isinstance(u, dict) or not any(isinstance(u.get(k), int) for k in
                                          ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")):
        return previous
    base = previous or Usage(0)
    pick = lambda key, old: u[key] if isinstance(u.get(key), int) else old  # noqa: E731
    return Usage(pick("input_tokens", base.fresh), pick("cache_read_input_tokens", base.cache_read),
                 pick("cache_creation_input_tokens", base.cache_write))


class TokenCalibration:
    """Collects (estimated, reported) prompt-token pairs; thread-safe.

    Args:
        counter: the counter whose estimates are calibrated.
        window: how many recent observations to keep.
    """

    def __init__(self, counter: TokenCounter, window: int = 500) -> None:
        self.counter = counter
        self.window = window
        self._pairs: list[tuple[int, int]] = []
        self._usage: list[Usage] = []
        self._sorted: list[float] = []  # reported / estimated of the window's pairs, ascending (the median in O(1))
        self._lock = threading.Lock()

    def estimate_request(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None) -> int:
        """Our estimate of a whole request's prompt tokens: every message, the tool schemas
        (their JSON text) and the reply priming."""
        n = self.counter.count_messages(messages) + REPLY_PRIMING
        if tools:
            n += self.counter.count(json.dumps(list(tools), separators=(",", ":"), ensure_ascii=False))
        return n

    def observe(self, estimated: int, reported: int | Usage) -> None:
        """Record one request: our estimate and the provider's prompt tokens (a number, or a
        :class:`Usage` whose fresh / cache-read / cache-write parts are tallied apart)."""
        usage = reported if isinstance(reported, Usage) else Usage(reported)
        if estimated <= 0 or usage.total <= 0:
            return
        with self._lock:
            self._pairs.append((estimated, usage.total))
            self._usage.append(usage)
            bisect.insort(self._sorted, usage.total / estimated)
            for e, r in self._pairs[:-self.window]:  # the oldest, out of the window
                del self._sorted[bisect.bisect_left(self._sorted, r / e)]
            del self._pairs[:-self.window], self._usage[:-self.window]

    @property
    def ratio(self) -> float:
        """Median of reported / estimated (1.0 before any observation), as ``statistics.median``
        gives it: the middle value, or the mean of the two middle ones. Read from the window's
        ratios kept sorted as they are observed (the proxy reads it on every request)."""
        with self._lock:
            xs = self._sorted
            n = len(xs)
            if not n:
                return 1.0
            return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2

    def adjusted_budget(self, budget: int) -> int:
        """B shrunk when the provider counts more than we do (never grown): ``floor(B / max(1, ratio))``."""
        return math.floor(budget / max(1.0, self.ratio))

    def summary(self) -> dict[str, Any]:
        """``{"observations", "median_ratio", "max_abs_error", "input_tokens"}`` (error in tokens;
        ``input_tokens``: the reported prompt tokens of the window, ``fresh`` / ``cache_read`` /
        ``cache_write``)."""
        with self._lock:
            pairs, usage = list(self._pairs), list(self._usage)
        return {"observations": len(pairs), "median_ratio": round(self.ratio, 4),
                "max_abs_error": max((abs(r - e) for e, r in pairs), default=0),
                "input_tokens": {"fresh": sum(u.fresh for u in usage), "cache_read": sum(u.cache_read for u in usage),
                                 "cache_write": sum(u.cache_write for u in usage)}}
