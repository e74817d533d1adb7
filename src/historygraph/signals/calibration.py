"""Token-count calibration against what the provider reports (issue 6, input 10).

Scope of our counts (documented in docs/robustness.md): B caps the *history* only — messages, their tool
calls and results, placeholders — counted with :class:`~historygraph.signals.tokens.TokenCounter`
(content + tool-call names and arguments + 3 tokens per message). The system prompt, the current
user message and the tool schemas are outside B (ContextRender A.4) but are part of what the
provider bills, so :meth:`TokenCalibration.estimate_request` counts all of them for comparison
with the provider's ``usage.prompt_tokens``.

The proxy calls :meth:`observe` whenever an upstream answer carries ``usage``; the ratio of
reported to estimated tokens then tells how far our counts drift (other tokenizers, hidden
formatting), and :meth:`adjusted_budget` shrinks B accordingly so renderings stay within the
provider's view of the budget.
"""

from __future__ import annotations

import json
import math
import statistics
import threading
from typing import Any, Sequence

from ..events import Message
from .tokens import TokenCounter

#: Tokens OpenAI's chat format adds to prime the assistant's reply (published counting recipe).
REPLY_PRIMING = 3


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
        self._lock = threading.Lock()

    def estimate_request(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None) -> int:
        """Our estimate of a whole request's prompt tokens: every message, the tool schemas
        (their JSON text) and the reply priming."""
        n = self.counter.count_messages(messages) + REPLY_PRIMING
        if tools:
            n += self.counter.count(json.dumps(list(tools), separators=(",", ":"), ensure_ascii=False))
        return n

    def observe(self, estimated: int, reported: int) -> None:
        """Record one request: our estimate and the provider's ``usage.prompt_tokens``."""
        if estimated <= 0 or reported <= 0:
            return
        with self._lock:
            self._pairs.append((estimated, reported))
            del self._pairs[:-self.window]

    @property
    def ratio(self) -> float:
        """Median of reported / estimated (1.0 before any observation)."""
        with self._lock:
            pairs = list(self._pairs)
        return statistics.median(r / e for e, r in pairs) if pairs else 1.0

    def adjusted_budget(self, budget: int) -> int:
        """B shrunk when the provider counts more than we do (never grown): ``floor(B / max(1, ratio))``."""
        return math.floor(budget / max(1.0, self.ratio))

    def summary(self) -> dict[str, float | int]:
        """``{"observations", "median_ratio", "max_abs_error"}`` (error in tokens)."""
        with self._lock:
            pairs = list(self._pairs)
        return {"observations": len(pairs), "median_ratio": round(self.ratio, 4),
                "max_abs_error": max((abs(r - e) for e, r in pairs), default=0)}
