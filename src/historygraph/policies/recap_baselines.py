"""ReCAP's heuristic baselines, Recency and Random, under ReCAP's character budget and B.

Source: ReCAP, "Persistent Context Graphs for Efficient Memory Compaction in LLM Agents" §3.1 (blocks, character cost, ``B_t = floor(β · c(V_t))``)
and §5 "Baselines" ("Recency retains the most recent content, and Random samples content and
restores its order").

* **Blocks** (§3.1): a user message; an assistant message with its tool calls and their results;
  a plain assistant message. These are exactly the units of :class:`~historygraph.render.Layout`.
  ``V`` is every block charged to B: system messages and the current user message are rendered
  separately (§3.1, and ContextRender A.4 for B's scope).
* **Cost** ``c(v)``: characters of message content plus serialized tool calls (name and
  arguments), summed over the block's messages. The character budget is
  ``C = floor(β · c(V))`` with ``β = 0.1`` by default.
* **Protected blocks**: the first user message and the latest assistant block (the current turn,
  possibly an in-flight call) are always kept (docs/architecture.md, invariant §5.4); their characters count first.
* **Both budgets**: a block is kept only when the characters kept stay within ``C`` *and* the
  history tokens stay within B (the evaluator checks tokens ≤ B for every policy).
* **Recency** keeps blocks newest first and stops at the first that does not fit, so what it keeps
  is the most recent contiguous run. **Random** visits blocks in an order shuffled by
  ``random.Random(f"{seed}:{session_id}:{turns}")`` (a session-and-turn seed, like ReCAP's
  exploration bonus), keeps each that fits, and renders the kept blocks in their original order.

Blocks that are not kept are left out entirely (not placeholders); they stay stored and can be
kept at a later invocation. A history that fits in B is returned unchanged (docs/architecture.md, invariant §5.5).
"""

from __future__ import annotations

import math
import random
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from ..graph import ContextGraph
from ..render import Layout, Rendering
from .base import Signals, register


def block_chars(graph: ContextGraph, positions: list[int]) -> int:
    """``c(v)`` of ReCAP §3.1: content characters plus serialized tool calls (name + arguments)."""
    total = 0
    for p in positions:
        m = graph.messages[p]
        total += len(m.content) + sum(len(c.name) + len(c.arguments) for c in m.tool_calls)
    return total


_CHARS: "weakref.WeakKeyDictionary[ContextGraph, list[int]]" = weakref.WeakKeyDictionary()
_CHARS_LOCK = threading.Lock()


def message_chars(graph: ContextGraph) -> np.ndarray:
    """:func:`block_chars` of every single message, by position (int64); kept per graph and
    extended on append (a stored message never changes)."""
    with _CHARS_LOCK:
        chars = _CHARS.setdefault(graph, [])
        for p in range(len(chars), len(graph.messages)):
            chars.append(block_chars(graph, [p]))
        return np.asarray(chars, dtype=np.int64)


def char_budget(beta: float, total_chars: int) -> int:
    """``B_t = floor(β · c(V_t))`` (ReCAP §3.1)."""
    return math.floor(beta * total_chars)


@dataclass(frozen=True)
class RecapBaselineConfig:
    """``beta``: nominal retention fraction β (ReCAP §3.1, 0.1); ``seed``: Random's base seed."""

    beta: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.beta <= 1:
            raise ValueError(f"ReCAP baseline config: beta must be in (0, 1], got {self.beta}")


class _BlockBaseline:
    Config = RecapBaselineConfig
    contiguous = True

    def __init__(self, name: str, config: RecapBaselineConfig | None = None) -> None:
        self.name, self.config = name, config or RecapBaselineConfig()

    def order(self, graph: ContextGraph, blocks: list[int]) -> list[int]:
        raise NotImplementedError

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        base = Layout(graph, signals.counter, budget)
        if base.fits_in_full:
            return base.assemble_full(self.name)
        units = base.units
        chars = base.unit_totals(message_chars(graph)).tolist()  # c(v) per block
        full = (np.asarray([u.cost for u in units], dtype=np.int64) + base.unit_result_deltas()).tolist()
        cap = char_budget(self.config.beta, sum(chars))
        protected = [i for i, u in enumerate(units) if u.protected]
        used_chars = sum(chars[i] for i in protected)
        used_tokens = sum(units[i].cost for i in protected)
        kept: set[int] = set(protected)
        visited: list[tuple[int, int | None]] = []  # (block, characters used after keeping it, or None)
        for i in self.order(graph, [i for i, u in enumerate(units) if not u.protected]):
            tokens = full[i]  # its messages with every result shown
            if used_chars + chars[i] <= cap and used_tokens + tokens <= budget:
                kept.add(i)
                used_chars += chars[i]
                used_tokens += tokens
                visited.append((i, used_chars))
            else:
                visited.append((i, None))
                if self.contiguous:
                    break
        layout = Layout(graph, signals.counter, budget, result_reserve=0.0,  # kept blocks fit B by construction
                        omit_units=[i for i in range(len(units)) if i not in kept])

        def fill(reasons: dict[int, str]) -> None:  # per message, when someone reads them
            why = {i: (f"kept: {chars[i]} chars; {used} of C = {cap} chars used" if used is not None else
                       f"left out: {chars[i]} chars do not fit in C = {cap} chars (or B)") for i, used in visited}
            for i, u in enumerate(units):
                for p in u.positions:
                    reasons[p] = why.get(i, "left out: older than the kept recent blocks" if i not in kept
                                         else "kept: protected block")
        layout.defer_reasons(fill)
        sel = layout.selection()
        for p in reversed(layout.candidates):
            if sel.fits(p):
                sel.take(p)
        return layout.assemble(self.name, sel)


@register("recap-recency", "ReCAP §3.1 (character budget), §5 Baselines (Recency)",
          "Newest blocks first within floor(β·c(V)) characters and B tokens; the rest left out.")
class RecapRecency(_BlockBaseline):
    """ReCAP's Recency baseline: the most recent blocks within both budgets (module docstring)."""

    def __init__(self, name: str = "recap-recency", config: RecapBaselineConfig | None = None) -> None:
        super().__init__(name, config)

    def order(self, graph: ContextGraph, blocks: list[int]) -> list[int]:
        return list(reversed(blocks))


@register("recap-random", "ReCAP §3.1 (character budget), §5 Baselines (Random)",
          "Seeded random blocks within floor(β·c(V)) characters and B tokens, rendered in original order.")
class RecapRandom(_BlockBaseline):
    """ReCAP's Random baseline: seeded random blocks within both budgets, original order kept."""

    contiguous = False

    def __init__(self, name: str = "recap-random", config: RecapBaselineConfig | None = None) -> None:
        super().__init__(name, config)

    def order(self, graph: ContextGraph, blocks: list[int]) -> list[int]:
        rng = random.Random(f"{self.config.seed}:{graph.session_id}:{graph.turns}")
        return rng.sample(blocks, len(blocks))
