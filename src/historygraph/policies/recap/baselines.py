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
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from historygraph.history.graph import ContextGraph
from historygraph.render import Layout, Rendering
from historygraph.render._grow import Grow
from historygraph.policies.base import Signals
from historygraph.policies.registry import register


def block_chars(graph: ContextGraph, positions: list[int]) -> int:
    """``c(v)`` of ReCAP §3.1: content characters plus serialized tool calls (name + arguments)."""
    total = 0
    for p in positions:
        m = graph.messages[p]
        total += len(m.content) + sum(len(c.name) + len(c.arguments) for c in m.tool_calls)
    return total


_CHARS = "recap.message_chars"  # graph.memo key: (the chars by position, the lock held while they grow)


def message_chars(graph: ContextGraph) -> np.ndarray:
    """:func:`block_chars` of every single message, by position (int64, a read-only view); kept
    per graph and extended on append (a stored message never changes)."""
    chars, lock = graph.memo(_CHARS, lambda: (Grow(), threading.Lock()))
    with lock:
        if chars.n < len(graph.messages):
            chars.extend([block_chars(graph, [p]) for p in range(chars.n, len(graph.messages))])
        return chars.view()


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

    def visits(self, graph: ContextGraph, blocks: list[int]) -> Iterator[int]:
        """:meth:`order`, drawn as the blocks are visited (the selection may stop early)."""
        return iter(self.order(graph, blocks))

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        base = Layout(graph, signals.counter, budget)
        if base.fits_in_full:
            return base.assemble_full(self.name)
        assert budget is not None  # (no budget: the history fits)
        units = base.units
        chars_arr = base.unit_totals(message_chars(graph))  # c(v) per block
        full_arr = base.unit_costs + base.unit_result_deltas()  # tokens of each block with every result shown
        cap = char_budget(self.config.beta, int(chars_arr.sum()))
        protected = [i for i, u in enumerate(units) if u.protected]
        used_chars = int(chars_arr[protected].sum())
        used_tokens = sum(units[i].cost for i in protected)
        open_mask = np.ones(len(units), dtype=bool)
        open_mask[protected] = False
        # a block fits only if both its characters and its tokens do: once the fewest of either
        # among all unprotected blocks no longer fits, no block visited later can be kept (only
        # a non-contiguous order goes on after a block that does not fit)
        least_chars = int(chars_arr[open_mask].min()) if open_mask.any() else 0
        least_tokens = int(full_arr[open_mask].min()) if open_mask.any() else 0
        chars, full = chars_arr.tolist(), full_arr.tolist()
        kept: set[int] = set(protected)
        visited: list[tuple[int, int | None]] = []  # (block, characters used after keeping it, or None)
        stopped = False
        for i in self.visits(graph, open_mask.nonzero()[0].tolist()):
            if not self.contiguous and (used_chars + least_chars > cap or used_tokens + least_tokens > budget):
                stopped = True  # every block not visited yet would be visited and left out
                break
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
        omit = open_mask.copy()
        omit[list(kept)] = False
        layout = Layout(graph, signals.counter, budget, result_reserve=0.0,  # kept blocks fit B by construction
                        omit_units=omit.nonzero()[0].tolist())

        def fill(reasons: dict[int, str]) -> None:  # per message, when someone reads them
            why = {i: (f"kept: {chars[i]} chars; {used} of C = {cap} chars used" if used is not None else
                       f"left out: {chars[i]} chars do not fit in C = {cap} chars (or B)") for i, used in visited}
            for i, u in enumerate(units):
                if i not in why and stopped and not u.protected:  # visited after the stop
                    why[i] = f"left out: {chars[i]} chars do not fit in C = {cap} chars (or B)"
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

    def visits(self, graph: ContextGraph, blocks: list[int]) -> Iterator[int]:
        """:meth:`order` one block at a time: the draws of ``random.Random.sample(blocks,
        len(blocks))`` (CPython's pool algorithm: draw ``j`` below the ``n − i`` blocks not yet
        drawn by rejection from ``getrandbits``, swap the last one into ``j``), so the first ``k``
        blocks are those of the whole sample (tests/test_baselines.py checks it against
        ``sample``) and stopping early costs only the draws made."""
        rng = random.Random(f"{self.config.seed}:{graph.session_id}:{graph.turns}")
        getrandbits = rng.getrandbits
        pool = list(blocks)
        n = len(pool)
        for i in range(n):
            m = n - i
            k = m.bit_length()
            j = getrandbits(k)
            while j >= m:
                j = getrandbits(k)
            yield pool[j]
            pool[j] = pool[m - 1]
