"""How a cache-stable rendering grows between re-selections (:mod:`historygraph.policies.cache_stable`,
whose module docstring gives the design and the measurements): appending what arrived
(:func:`extend`), complete copies of results shown again at the end (:func:`recalled_copies`,
:func:`predicted_copies`), and the minor collection of the young generation (:func:`collect_young`,
:func:`young_start`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.render import BudgetTooSmallError, Layout, Rendering
from historygraph.render.markers import RECALLED, placeholder_for
from historygraph.signals.tokens import TokenCounter

if TYPE_CHECKING:
    from historygraph.policies.cache_stable import CacheStableConfig

YOUNG_COST_EXPONENT = 1.0
"""A minor collection takes young results in ascending ``p / t^α`` (p the reuse probability, t the
tokens its placeholder saves): least likely per token first. α = 1 was chosen among 0 (by
probability alone), 0.5, 1 and 2 on the half of the real sessions ``young`` was chosen on
(docs/evaluator.md, "Generations")."""


def extend(prev: Rendering, length: int, graph: ContextGraph, budget: int, counter: TokenCounter,
           name: str, recall_tail: bool = False, predict: "Callable[[list[int]], Sequence[float]] | None" = None,
           threshold: float = 1.0) -> Rendering | None:
    """``prev`` (the rendering of the graph's first ``length`` messages) with the messages since
    appended as stored, or ``None`` when they are not a plain continuation or the history would
    pass ``budget`` tokens (:mod:`~historygraph.policies.cache_stable`'s docstring). ``recall_tail``: append :func:`recalled_copies`;
    ``predict`` (reuse probabilities of results by position) and ``threshold``: append
    :func:`predicted_copies`."""
    msgs, n = graph.messages, len(graph)
    if n == length:
        return prev
    if n < length or next((p for p in reversed(prev.positions) if p is not None), None) != length - 1:
        return None
    last = msgs[length - 1]
    pending = {c.id for c in last.tool_calls} if last.role == "assistant" else set()
    for p in range(length, n):
        m = msgs[p]
        if m.role == "tool":
            if m.tool_call_id not in pending or graph.result_of.get(m.tool_call_id) != p:
                return None
            pending.discard(m.tool_call_id)
        elif pending or m.role == "system":
            return None  # a message between a call and its results, or a new system message: re-select
        elif m.role == "assistant":
            pending = {c.id for c in m.tool_calls}
    if pending and msgs[n - 1].role != "assistant":
        return None  # some results of the last calls arrived, not all: the wrapped policy answers the rest
    users = [p for p in range(n) if msgs[p].role == "user"]
    current = users[-1] if users else None
    before = max((p for p in users if p < length), default=None)
    count = counter.count_message
    history = prev.history_tokens + sum(count(msgs[p]) for p in range(length, n) if p != current)
    if before is not None and before != current:
        history += count(msgs[before])  # the previous current user message is ordinary history now
    if history > budget:
        return None
    new: list[int | None] = list(range(length, n))
    added = range(length, n)
    r = Rendering(policy=name, budget=budget, messages=prev.messages + [msgs[p] for p in added],
                  positions=prev.positions + new, full=prev.full + [p for p in added if msgs[p].role == "tool"],
                  omitted=list(prev.omitted), dropped=list(prev.dropped), history_tokens=history,
                  input_tokens=prev.input_tokens + sum(count(msgs[p]) for p in added), stats={"cache_stable": "appended"})
    copies = recalled_copies(graph, r, length, budget, counter) if recall_tail else []
    predicted = predicted_copies(graph, r, length, budget, counter, predict, threshold) if predict is not None else {}
    _defer_tail_reasons(r, prev, added, copies, predicted, threshold)
    return r


def _defer_tail_reasons(r: Rendering, prev: Rendering, added: range, copies: list[int], predicted: dict[int, float],
                        threshold: float, collected: Sequence[int] = ()) -> None:
    """Let ``r``'s reasons be ``prev``'s, with those of the messages ``added`` since, the results
    ``collected`` into placeholders (:func:`collect_young`) and the copies appended at the end
    (``copies``: :func:`recalled_copies`; ``predicted``: :func:`predicted_copies` at ``threshold``)."""
    kept = prev.reasons

    def reasons() -> dict[int, str]:
        out = dict(kept)
        out.update({p: "appended: arrived since the last re-selection (cache-stable rendering)" for p in added})
        out.update({p: "placeholder: collected from the young generation, least likely reused per token first (cache-stable rendering)"
                    for p in collected})
        out.update({p: "shown again at the end: the latest tool call used its values (cache-stable rendering)" for p in copies})
        out.update({p: f"shown again at the end: reuse probability {q:.3f} ≥ predicted_tail {threshold:g} (cache-stable rendering)"
                    for p, q in predicted.items()})
        return out
    r.defer_reasons(reasons)


def young_start(r: Rendering, graph: ContextGraph) -> int:
    """Where the young generation of ``r`` begins after a collection or re-selection: right after
    the latest assistant message (its results, the newest, which §5.9 keeps complete, and any copy
    after them stay young, so that a later minor collection may still replace them; the message
    itself is never collected); the whole rendering when it does not show that message. The old
    generation then ends where Claude Code puts its own breakpoint on the message before the last
    (the assistant turn): through the proxy, whose breakpoints Claude Code's four leave no room
    for, the next collection reads the old generation from the entry Claude Code's mark wrote."""
    latest = graph.latest_operations  # (the latest assistant message's position, its TFA values)
    if latest is None:
        return len(r.messages)
    return next((i + 1 for i in range(len(r.messages) - 1, -1, -1) if r.positions[i] == latest[0]), len(r.messages))


def collect_young(prev: Rendering, length: int, graph: ContextGraph, budget: int, counter: TokenCounter, name: str,
                  boundary: int, cfg: CacheStableConfig,
                  rank: "Callable[[list[int]], Sequence[float]]") -> Rendering | None:
    """A minor collection: ``prev`` with the messages since appended, then, among its messages
    from index ``boundary`` on (the young generation: what was appended since the last collection
    or re-selection), complete stored results replaced by their placeholders and copies shown
    again at the end removed, least likely per token first by ``rank`` (reuse probabilities by
    position, :data:`YOUNG_COST_EXPONENT`; the oldest first among equals), until the history is within ``cfg.young``·``budget`` tokens; then
    the copies of :func:`extend` (``cfg.recall_tail``, ``cfg.predicted_tail``) within ``budget``.
    The first ``boundary`` messages stay byte for byte, so a cache breakpoint there is read.
    ``None`` (re-select) when the messages since are not a plain continuation, when the complete
    history fits in ``budget`` (the wrapped policy returns it unchanged, §5.5), or when even with
    every young result collected the history stays over ``cfg.young``·``budget``. The newest
    results (§5.9), pinned ones and results shorter than their placeholder are never collected
    (:mod:`~historygraph.policies.cache_stable`'s docstring)."""
    try:
        if Layout(graph, counter, budget).fits_in_full:
            return None
    except BudgetTooSmallError:
        return None
    r = extend(prev, length, graph, 10**12, counter, name)
    if r is None:
        return None
    latest = graph.latest_operations  # (the latest assistant message's position, its TFA values)
    calls = graph.messages[latest[0]].tool_calls if latest is not None else ()
    newest = {graph.result_of[c.id] for c in calls if c.id in graph.result_of}
    keep = newest | graph.pins
    count = counter.count_message
    young: list[tuple[int, int, int]] = []  # (index in r.messages, source position, tokens saved)
    for i in range(boundary, len(r.messages)):
        m, p = r.messages[i], r.positions[i]
        if p is not None and m.role == "tool" and m.rendered_as is None and p not in keep:
            saved = count(m) - count(placeholder_for(m, counter))
            if saved > 0:  # (a result shorter than its placeholder stays)
                young.append((i, p, saved))
        elif p is None and m.rendered_as == "recalled":
            s = graph.result_of.get(m.content[len(_RECALLED_HEAD):].split(_RECALLED_AFTER_ID, 1)[0])
            if s is not None:
                young.append((i, s, count(m)))
    target = int(cfg.young * budget)
    if not young or r.history_tokens - sum(t for _, _, t in young) > target:
        return None
    prob = list(rank([s for _, s, _ in young]))
    order = sorted(range(len(young)), key=lambda k: (prob[k] / young[k][2] ** YOUNG_COST_EXPONENT, young[k][1]))
    collected: dict[int, int] = {}  # index in r.messages -> source position
    saved = 0
    for k in order:
        if r.history_tokens - saved <= target:
            break
        i, s, t = young[k]
        collected[i] = s
        saved += t
    full = list(r.full)
    placeholders: list[int] = []
    messages: list[Message] = []
    positions: list[int | None] = []
    for i, (m, p) in enumerate(zip(r.messages, r.positions)):
        if i not in collected:
            messages.append(m)
            positions.append(p)
            continue
        full.remove(collected[i])  # (a copy's source: its one entry there)
        if p is not None:
            messages.append(placeholder_for(m, counter))
            positions.append(p)
            placeholders.append(p)
    r.messages, r.positions, r.full = messages, positions, full
    r.omitted = sorted(set(r.omitted) | set(placeholders))
    r.history_tokens -= saved
    r.input_tokens -= saved
    r.budget = budget
    r.stats = {"cache_stable": "collected"}
    copies = recalled_copies(graph, r, length, budget, counter) if cfg.recall_tail else []
    predicted: dict[int, float] = {}
    if cfg.predicted_tail > 0:
        predicted = predicted_copies(graph, r, length, budget, counter, rank, cfg.predicted_tail)
    _defer_tail_reasons(r, prev, range(length, len(graph)), copies, predicted, cfg.predicted_tail, sorted(placeholders))
    return r


_RECALLED_HEAD, _RECALLED_AFTER_ID = RECALLED.split("{content}")[0].split("{id}")  # the text around a copy's id


def _append_copy(r: Rendering, graph: ContextGraph, s: int, budget: int, counter: TokenCounter) -> bool:
    """Append a complete copy of the result at ``s`` to ``r`` (in place), headed with its id, if the
    history stays within ``budget``; whether it was."""
    m = graph.messages[s]
    copy = Message("user", RECALLED.format(id=m.tool_call_id, content=m.content), rendered_as="recalled")
    t = counter.count_message(copy)
    if r.history_tokens + t > budget:
        return False
    r.messages.append(copy)
    r.positions.append(None)
    r.full.append(s)
    r.history_tokens += t
    r.input_tokens += t
    return True


def recalled_copies(graph: ContextGraph, r: Rendering, length: int, budget: int, counter: TokenCounter) -> list[int]:
    """Append to ``r`` (in place) a complete copy of each result not shown complete whose values
    the latest assistant message used (TFA's attribution, ContextRender §3.2 / A.2: each value to
    the first result that held it), while the history stays within ``budget``; returns their
    positions. Only when that message arrived since the previous rendering (position ≥ ``length``)
    and the rendering ends with a tool result (a copy never follows a call in flight or the
    current user message)."""
    msgs = graph.messages
    latest = graph.latest_operations
    if latest is None or latest[0] < length or msgs[-1].role != "tool":
        return []
    shown = set(r.full)
    sources: list[int] = []
    for values in latest[1]:
        for v in values:
            s = graph.reuse.first_holder(v)
            if s is not None and s < latest[0] and s not in shown and s not in sources:
                sources.append(s)
    return [s for s in sorted(sources) if _append_copy(r, graph, s, budget, counter)]


def predicted_copies(graph: ContextGraph, r: Rendering, length: int, budget: int, counter: TokenCounter,
                     predict: "Callable[[list[int]], Sequence[float]]", threshold: float) -> dict[int, float]:
    """Append to ``r`` (in place) a complete copy of each stored result it does not show complete
    whose reuse probability (``predict``) is at least ``threshold``, most probable first, while the
    history stays within ``budget``; returns ``{position: probability}`` of those appended. Only
    after a new tool result, as :func:`recalled_copies`."""
    if len(graph) <= length or graph.messages[-1].role != "tool":
        return {}
    shown = set(r.full)
    cands = [p for p in graph.results() if p not in shown]
    prob = predict(cands) if cands else []
    ranked = sorted((i for i in range(len(cands)) if prob[i] >= threshold), key=lambda i: (-prob[i], cands[i]))
    return {cands[i]: float(prob[i]) for i in ranked if _append_copy(r, graph, cands[i], budget, counter)}
