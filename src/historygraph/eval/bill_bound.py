"""The bill bound: the least any rendering that keeps the invariants can cost on a trace, with a
provider's prompt cache, at a given Later-Used Result Recall (an honest lower bound, ours).

Two parts, both counted in tokens of the trace and priced by a :class:`~.prices.PriceModel`:

* **the floor**, whatever is selected. Every message before the last model call is sent at least
  once (the latest user and assistant messages and the results of the latest assistant message are
  always shown: invariants 5 and 9 of docs/architecture.md), and the first time a message is sent no
  cache holds it, so it costs at least ``min(input, cache_write)`` per token; the tool schemas lead
  every request and cost at least ``min(input, cached_input)`` per token at every call after the
  first; the output is the same for every policy. A newest result that cannot be shown whole (with
  the first user message and the assistant message that made it, its call's results exceed B) may be
  any excerpt, so it counts 0 tokens.
* **the recall part.** Recall counts a reuse event ``(j, r)`` only when ``r`` is shown whole in the
  rendering for call ``j`` (ContextRender: From Execution Dependencies to Agent Context, arXiv 2609.37743, Appendix B.4). When ``r`` is a result of
  the assistant message just before ``j`` it is shown anyway (already in the floor); otherwise that
  call sends ``r`` again, at least at ``min(input, cached_input)`` per token. Each distinct event is
  its own call-and-result pair, so reaching ``k`` such events costs at least the ``k`` smallest of
  those resends.

``bound(R) = floor + cheapest resends of the events beyond the free ones needed for R %``. It is a
lower bound (no rendering keeping the invariants with recall R costs less), not an achievable cost:
it ignores that a cache read needs the same prefix as before, which a selection that changes what
it shows breaks. The oracle's recall with the bound at it says how far the bill could go down.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from historygraph.eval.prices import PriceModel
from historygraph.eval.prompt_cache import CacheTokens, bill
from historygraph.eval.recall import ReuseEvent
from historygraph.history.events import Message
from historygraph.signals.tokens import TokenCounter


@dataclass(frozen=True)
class BoundInputs:
    """What the bound of one trace at one budget needs (tokens): ``once``, the messages sent at least
    once (plus the tool schemas' first sending); ``schema_reads``, the tool schemas at every later
    call; ``events`` (all B.4 events), ``free`` (those whose result is a newest result, shown
    anyway) and ``resends``, the tokens of each other event's result, ascending."""

    once: int
    schema_reads: int
    events: int
    free: int
    resends: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def bound_inputs(messages: Sequence[Message], events: Sequence[ReuseEvent], counter: TokenCounter, fixed: int,
                 budget: int | None) -> BoundInputs:
    """:class:`BoundInputs` of a trace (``messages`` in order; ``events``, its B.4 reuse events;
    ``fixed``, its tool schemas' tokens; ``budget``, B in tokens, ``None`` for none)."""
    calls = [i for i, m in enumerate(messages) if m.role == "assistant" and i > 0]
    if not calls:
        return BoundInputs(0, 0, len(events), 0)
    first_user = next((counter.count_message(m) for m in messages if m.role == "user"), 0)
    sizes = [counter.count_message(m) for m in messages]
    once = fixed
    maker = -1  # the latest assistant message so far: the results after it are its results
    batch: list[int] = []  # positions of the current assistant message's results
    for i, m in enumerate(messages[:calls[-1]]):
        if m.role == "assistant":
            once += _results_shown(batch, sizes, first_user + sizes[maker] if maker >= 0 else first_user, budget)
            batch, maker = [], i
            once += sizes[i]
        elif m.role == "tool":
            batch.append(i)
        else:
            once += sizes[i]
    once += _results_shown(batch, sizes, first_user + (sizes[maker] if maker >= 0 else 0), budget)
    last_assistant_before: dict[int, int] = {}
    latest = -1
    for i, m in enumerate(messages):
        last_assistant_before[i] = latest
        if m.role == "assistant":
            latest = i
    free = sum(1 for e in events if e.result > last_assistant_before[e.turn])
    resends = sorted(sizes[e.result] for e in events if e.result <= last_assistant_before[e.turn])
    return BoundInputs(once, fixed * (len(calls) - 1), len(events), free, resends)


def _results_shown(batch: list[int], sizes: list[int], protected: int, budget: int | None) -> int:
    """Tokens the newest results ``batch`` are sure to cost: all of them when they fit B beside the
    ``protected`` tokens, else 0 (they may be excerpts of any size)."""
    total = sum(sizes[i] for i in batch)
    return total if budget is None or total + protected <= budget else 0


def bill_bound(model: PriceModel, inputs: BoundInputs, output: int, recall_pct: float = 0.0) -> float:
    """The bound in USD at ``recall_pct`` (0-100; 0 gives the floor) under ``model``, with ``output``
    tokens of the trace's answers. A recall above what the resends can reach is priced with all of
    them (the policy's own recall is at most that)."""
    first = CacheTokens(uncached=inputs.once) if model.input <= model.write_price else CacheTokens(write=inputs.once)
    k = max(0, math.ceil(recall_pct / 100 * inputs.events - 1e-9) - inputs.free)
    again = inputs.schema_reads + sum(inputs.resends[:k])
    repeat = CacheTokens(read=again) if model.cached_input <= model.input else CacheTokens(uncached=again)
    return bill(model, first + repeat, output)
