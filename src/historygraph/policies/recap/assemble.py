"""A ReCAP rendering of the shown blocks: chronological (results directly after their call), the
system messages and the current user message outside ``B``, each run of steps left out replaced
by one dropped-step marker (docs/architecture.md, invariant §5.6) that never follows a text reply
inside the active tool loop (§5.7), oversized results as their marked excerpt."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.policies.base import Signals
from historygraph.policies.recap.blocks import Block, IndexedBlocks, build_blocks, synthetic_results
from historygraph.render import SEGMENT_JOIN, Rendering, dropped_marker, kept_render_order
from historygraph.render.order import loop_bounds


def assemble(name: str, graph: ContextGraph, shown: list[Block], budget: int | None, signals: Signals,
             stats: dict[str, Any], forms: dict[int, Message] | None = None,
             plain: list[Block] | None = None, index: IndexedBlocks | None = None) -> Rendering:
    """Render the ``shown`` blocks chronologically with the system messages (current user message
    and system messages outside ``B``); results of other blocks are omitted, their messages dropped;
    a shown result in ``forms`` (:func:`~historygraph.policies.recap.blocks.oversized_forms`) is rendered as its excerpt and counted as omitted.
    ``plain``: ``build_blocks(graph)`` when the caller has it (the reasons name those blocks);
    ``index``: the graph's :func:`~historygraph.policies.recap.blocks.indexed_blocks` (the positions by role, found by a scan otherwise)."""
    # (over 80 lines: one walk whose marker closure, mark, rewrites the walk's own output, positions,
    # history count and run as it goes; split apart, those six pieces of state would be passed around)
    forms = forms or {}
    systems, users, tools = _role_positions(graph, index)
    keep = {p for b in shown for p in b.positions} | set(systems)
    pieces: dict[int, list[Block]] = {}
    for b in shown:
        if b.span is not None:
            pieces.setdefault(b.positions[0], []).append(b)
    outside = set(systems) | set(users[-1:])
    count = signals.counter.count_message
    msgs = graph.messages
    out: list[Message] = []
    positions: list[int | None] = []
    history = 0
    run: list[Sequence[int]] = []  # consecutive steps left out: one dropped-step marker (docs/architecture.md, invariant §5.6)
    marked: dict[int, list[Sequence[int]]] = {}  # index in ``out`` of each marker -> the steps it stands for
    opening = loop_bounds(graph, users)[2]  # loop_opening(graph)
    joined: set[int] = set()  # text replies left out with the steps after them (see mark)

    def mark() -> None:
        nonlocal history
        if not run:
            return
        # In the active tool loop (after its opening thinking block) a marker right after an
        # assistant message without tool calls is a wire user turn holding no tool result, and the
        # provider's loop would begin after it, at an assistant message without the thinking block
        # (docs/architecture.md, invariant §5.7). Such a reply (a late result is rendered before it,
        # at its call) is left out with the steps after it, and a marker it followed is merged.
        moved = False
        while opening is not None and positions:
            q = positions[-1]
            if q is None and moved and out[-1].rendered_as == "marker":
                run[:0] = marked.pop(len(out) - 1)
            elif q is not None and q > opening and msgs[q].role == "assistant" and not msgs[q].tool_calls:
                run.insert(0, [q])
                keep.discard(q)
                joined.add(q)
                moved = True
            else:
                break
            history -= 0 if q in outside else count(out.pop())
            positions.pop()
        marker = dropped_marker(graph, run)
        marked[len(out)] = list(run)
        out.append(marker)
        positions.append(None)
        history += count(marker)
        run.clear()

    # The render order (results directly after their call), walked over its kept entries: each
    # entry left out that is not a result starts a dropped step of the current run (its block's
    # positions); a kept message that is not a result closes the run
    kept_order, gone_counts, gone_steps = _render_walk(graph, signals, keep, tools, index)
    walked = 0
    for p, gone_before in zip(kept_order, gone_counts):
        if gone_before > walked:
            run.extend(gone_steps[walked:gone_before])
            walked = gone_before
        if msgs[p].role != "tool":
            mark()
        m = forms.get(p, graph.messages[p])
        if p in pieces and len(pieces[p]) < pieces[p][0].pieces:
            spans = sorted(x.span for x in pieces[p] if x.span is not None)  # (every piece's is set)
            m = m.with_content(SEGMENT_JOIN.join(m.content[a:b] for a, b in spans), "segments")
        out.append(m)
        positions.append(p)
        history += 0 if p in outside else count(m)
        for s in synthetic_results(graph, p):
            out.append(s)
            positions.append(None)
            history += count(s)
    run.extend(gone_steps[walked:])
    mark()
    if plain is None:
        plain = build_blocks(graph)
    kept_now = np.zeros(len(msgs), dtype=bool)  # keep after the walk (a reply joined to a run left it)
    kept_now[list(keep)] = True
    tool_arr = np.asarray(tools, dtype=np.int64)
    shown_full = kept_now[tool_arr]
    if forms:
        shown_full &= ~np.isin(tool_arr, np.fromiter(forms, dtype=np.int64, count=len(forms)))
    r = Rendering(policy=name, budget=budget, messages=out, positions=positions,
                  full=tool_arr[shown_full].tolist(), omitted=tool_arr[~shown_full].tolist(),
                  dropped=(~kept_now).nonzero()[0].tolist(), history_tokens=history,
                  input_tokens=sum(count(m) for m in out), stats=stats)
    r.defer_reasons(_reasons(graph, plain, keep, joined, forms, signals))
    return r


def _role_positions(graph: ContextGraph, index: IndexedBlocks | None) -> tuple[list[int], list[int], list[int]]:
    """The positions of the system, user and tool messages: the index's, else found by a scan."""
    if index is not None:
        return index.systems, index.users, index.tools
    systems = [p for p, m in enumerate(graph.messages) if m.role == "system"]
    users = [p for p, m in enumerate(graph.messages) if m.role == "user"]
    tools = [p for p, m in enumerate(graph.messages) if m.role == "tool"]
    return systems, users, tools


def _render_walk(graph: ContextGraph, signals: Signals, keep: set[int], tools: list[int],
                 index: IndexedBlocks | None) -> tuple[list[int], list[int], list[Sequence[int]]]:
    """The render order's kept entries (positions in ``keep``), for each the number of entries left
    out before it that are not results, and the steps those entries start (a dropped step's
    positions: its block's, from ``index`` when given), found for all entries at once."""
    msgs = graph.messages
    order = kept_render_order(graph, signals.counter)
    order_arr = np.fromiter(order, dtype=np.int64, count=len(order))
    keep_mask = np.zeros(len(msgs), dtype=bool)
    keep_mask[list(keep)] = True
    tool_mask = np.zeros(len(msgs), dtype=bool)
    tool_mask[tools] = True
    kept_here = keep_mask[order_arr]
    gone = ~kept_here & ~tool_mask[order_arr]
    gone_pos = order_arr[gone].tolist()
    steps = index.steps if index is not None else {}  # (a dropped step's positions: its block's)
    gone_steps: list[Sequence[int] | None] = list(map(steps.get, gone_pos))
    if None in gone_steps:
        for i, step in enumerate(gone_steps):
            if step is None:
                q = gone_pos[i]
                gone_steps[i] = [q] + [graph.result_of[c.id] for c in msgs[q].tool_calls if c.id in graph.result_of]
    return order_arr[kept_here].tolist(), np.cumsum(gone)[kept_here].tolist(), gone_steps  # type: ignore[return-value]  # (no None left)


def _reasons(graph: ContextGraph, plain: list[Block], keep: set[int], joined: set[int], forms: dict[int, Message],
             signals: Signals) -> Callable[[], dict[int, str]]:
    """The reason of each message of an assembled rendering, computed when someone reads them
    (``keep`` and ``joined`` as the assembly left them)."""
    n, msgs, count = len(graph), graph.messages, signals.counter.count_message

    def reasons() -> dict[int, str]:  # per message, when someone reads them
        block_of = {p: b for b in plain for p in b.positions}
        out = {p: f"block {block_of[p].id} dropped by ReCAP selection" for p in range(n) if p not in keep and p in block_of}
        for p in joined:
            out[p] = (f"block {block_of[p].id} left out with the dropped steps after it: their marker must not follow a "
                      "text reply inside the active tool loop (docs/architecture.md, invariant §5.7)")
        for p in keep & forms.keys():
            out[p] = (f"oversized: {count(msgs[p])} tokens > B; shown as a marked excerpt"
                      if forms[p].rendered_as == "excerpt" else
                      "placeholder: its block opens the active tool loop (protected) and its results do not fit")
        return out
    return reasons
