"""ReCAP's blocks (§3.1) and what they cost: the selectable units of a graph (a user message; an
assistant message with its tool calls and their results; a plain assistant message, or with
``segment`` = ``paragraph``/``line`` each of its pieces, §4.4), kept per graph across renders and
extended on append (:func:`indexed_blocks`), their token costs with oversized results as the
shared excerpt and unanswered calls' synthetic results, and a block's identifiers ``I(v)``."""

from __future__ import annotations

import bisect
import functools
import re
import threading
from dataclasses import dataclass
from typing import Any

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.policies.base import Signals
from historygraph.render import SEGMENT_JOIN, UNANSWERED, excerpt_for, oversized_excerpt, placeholder_for
from historygraph.render._memo import token_memo
from historygraph.signals.identifiers import identifiers


@dataclass(frozen=True)
class Block:
    """One atomic block (§3.1): graph ``positions`` (first = the user/assistant message), its role,
    and for a segment of a plain assistant message (§4.4 ablations) its ``span`` of characters."""

    id: int
    positions: tuple[int, ...]
    role: str
    span: tuple[int, int] | None = None
    pieces: int = 1


_FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)
_SEPARATORS = {"paragraph": re.compile(r"\n(?:[ \t]*\n)+"), "line": re.compile(r"\n")}


def segments(text: str, mode: str) -> list[tuple[int, int]]:
    """Character spans of the paragraphs (blank-line separated) or lines of ``text``; a fenced code
    block (```…```) is never split. Pieces are trimmed of surrounding whitespace; empty ones are left out."""
    sep = _SEPARATORS[mode]
    cuts: list[tuple[int, int]] = []

    def split(a: int, b: int) -> None:
        for m in sep.finditer(text, a, b):
            cuts.append((a, m.start()))
            a = m.end()
        cuts.append((a, b))

    pos = 0
    for fence in _FENCE.finditer(text):
        split(pos, fence.start())
        cuts.append((fence.start(), fence.end()))
        pos = fence.end()
    split(pos, len(text))
    out = []
    for a, b in cuts:
        piece = text[a:b]
        if piece.strip():
            lead = len(piece) - len(piece.lstrip())
            out.append((a + lead, a + len(piece.rstrip())))
    return out


def build_blocks(graph: ContextGraph, segment: str = "message") -> list[Block]:
    """The blocks of ``graph`` in chronological order; system messages are not blocks. With
    ``segment`` = ``paragraph`` or ``line`` a plain assistant message becomes one block per piece."""
    out: list[Block] = []
    for p, m in enumerate(graph.messages):
        if m.role == "user":
            out.append(Block(len(out), (p,), "user"))
        elif m.role == "assistant" and m.tool_calls:
            res = tuple(graph.result_of[c.id] for c in m.tool_calls if c.id in graph.result_of)
            out.append(Block(len(out), (p, *res), "assistant"))
        elif m.role == "assistant":
            pieces = segments(m.content, segment) if segment != "message" else []
            if len(pieces) < 2:
                out.append(Block(len(out), (p,), "assistant"))
            else:
                n = len(out)
                out.extend(Block(n + k, (p,), "assistant", span, len(pieces)) for k, span in enumerate(pieces))
    return out


class _BlockIndex:
    """:func:`build_blocks` of one graph and segment mode kept across renders, extended on append
    (the graph is append-only; a result stored after its call's block was built, e.g. one that
    supersedes a synthetic timeout, rebuilds that block, logged in ``rebuilt``), with the
    positions by role and what :func:`block_costs` keeps per token memo (``priced``)."""

    def __init__(self, segment: str) -> None:
        self.segment, self.n = segment, 0
        self.lock = threading.Lock()  # held while it is extended and read for a render
        self.blocks: list[Block] = []
        self.firsts: list[int] = []           # blocks[k].positions[0], ascending
        self.calls_at: dict[int, int] = {}    # position of an assistant message with calls -> its block
        # a block's first position -> the block's positions; only added to, replaced on a rebuild
        self.steps: dict[int, tuple[int, ...]] = {}
        self.result_block: dict[int, int] = {}  # a result's position -> the block that held it (a superset; as steps)
        self.incomplete: set[int] = set()     # blocks of a message with a call without a result
        self.rebuilt: list[int] = []
        self.users: list[int] = []
        self.systems: list[int] = []
        self.tools: list[int] = []
        self.priced: dict[int, tuple[Any, list[int], list[int]]] = {}  # id(memo) -> (memo, [blocks, log], costs)
        self.big: dict[int, tuple[Any, list[int], list[tuple[int, int]]]] = {}  # id(memo) -> (memo, [results], sorted (tokens, p))

    def _call_block(self, graph: ContextGraph, p: int, k: int) -> Block:
        m = graph.messages[p]
        res = tuple(graph.result_of[c.id] for c in m.tool_calls if c.id in graph.result_of)
        for r in res:
            self.result_block[r] = k
        if len(res) != len(m.tool_calls):
            self.incomplete.add(k)
        else:
            self.incomplete.discard(k)
        return Block(k, (p, *res), "assistant")

    def update(self, graph: ContextGraph) -> None:
        msgs, n0 = graph.messages, self.n
        out, firsts = self.blocks, self.firsts
        for p in range(n0, len(msgs)):
            m = msgs[p]
            role = m.role
            if role == "user":
                out.append(Block(len(out), (p,), "user"))
                firsts.append(p)
                self.users.append(p)
                self.steps[p] = (p,)
            elif role == "assistant" and m.tool_calls:
                self.calls_at[p] = len(out)
                out.append(self._call_block(graph, p, len(out)))
                firsts.append(p)
                self.steps[p] = out[-1].positions
            elif role == "assistant":
                self.steps[p] = (p,)
                pieces = segments(m.content, self.segment) if self.segment != "message" else []
                if len(pieces) < 2:
                    out.append(Block(len(out), (p,), "assistant"))
                    firsts.append(p)
                else:
                    n = len(out)
                    out.extend(Block(n + k, (p,), "assistant", span, len(pieces)) for k, span in enumerate(pieces))
                    firsts.extend([p] * len(pieces))
            elif role == "system":
                self.systems.append(p)
            if role == "tool":
                self.tools.append(p)
                owner = graph.call_owner.get(m.tool_call_id or "")
                if owner is not None and owner < n0:  # its call's block was built before it was stored
                    k = self.calls_at[owner]
                    # new dicts, not changed in place: a render may still read the ones it was given
                    self.steps, self.result_block = dict(self.steps), dict(self.result_block)
                    out[k] = self._call_block(graph, owner, k)
                    self.steps[owner] = out[k].positions
                    self.rebuilt.append(k)
        self.n = len(msgs)

    def over(self, tokens: list[int], memo: Any, budget: int) -> list[int]:
        """The results whose token count (the memo's) exceeds ``budget``, ascending; the results'
        ``(tokens, position)`` are kept sorted per token memo."""
        entry = self.big.get(id(memo))
        if entry is None or entry[0] is not memo:
            entry = self.big[id(memo)] = (memo, [0], [])
        _, seen, big = entry
        for p in self.tools[seen[0]:]:
            bisect.insort(big, (tokens[p], p))
        seen[0] = len(self.tools)
        return sorted(p for _, p in big[bisect.bisect_right(big, (budget, len(tokens))):])

    def costs(self, graph: ContextGraph, signals: Signals, tokens: list[int], memo: Any) -> list[int]:
        """Each block's :func:`block_tokens` without oversized forms, kept per token memo (0 for
        an incomplete block, whose synthetic results depend on the graph's length); a new list."""
        entry = self.priced.get(id(memo))
        if entry is None or entry[0] is not memo:
            entry = self.priced[id(memo)] = (memo, [0, len(self.rebuilt)], [])
        _, seen, costs = entry

        def static(k: int) -> int:
            b = self.blocks[k]
            if k in self.incomplete:
                return 0
            if b.span is not None:
                return block_tokens(graph, b, signals)
            return sum(tokens[p] for p in b.positions)
        for k in self.rebuilt[seen[1]:]:
            if k < seen[0]:
                costs[k] = static(k)
        costs.extend(static(k) for k in range(seen[0], len(self.blocks)))
        seen[0], seen[1] = len(self.blocks), len(self.rebuilt)
        return list(costs)


_BLOCKS = "recap.block_index"  # graph.memo key, with the segment mode


@dataclass
class IndexedBlocks:
    """A snapshot of a graph's :class:`_BlockIndex` for one render (lists copied): the blocks,
    their first positions, the positions of the user, system and tool messages, each block's
    cost by block id (:func:`block_costs` with the render's oversized ``forms``) and the blocks'
    positions by first position."""

    blocks: list[Block]
    firsts: list[int]
    users: list[int]
    systems: list[int]
    tools: list[int]
    costs: list[int]
    forms: dict[int, Message]
    steps: dict[int, tuple[int, ...]]  # (the index's own: only read)


def indexed_blocks(graph: ContextGraph, segment: str, budget: int | None, signals: Signals) -> IndexedBlocks:
    """``build_blocks(graph, segment)``, ``oversized_forms(graph, budget, signals)`` and
    ``block_costs`` of them, from the per-graph :class:`_BlockIndex` (the same values: the
    token counts are the per-graph memo's, as :func:`block_costs` reads them)."""
    memo = token_memo(graph, signals.counter, placeholder_for)
    tokens = memo.tokens
    index = graph.memo((_BLOCKS, segment), lambda: _BlockIndex(segment))
    with index.lock:
        index.update(graph)
        snap = IndexedBlocks(list(index.blocks), list(index.firsts), list(index.users), list(index.systems),
                       list(index.tools), [], {}, index.steps)
        costs = index.costs(graph, signals, tokens, memo)
        over = index.over(tokens, memo, budget) if budget is not None else []
        incomplete, result_block = set(index.incomplete), index.result_block  # (replaced, not changed, on a rebuild)
    msgs, counter = graph.messages, signals.counter
    if budget is not None:  # the oversized results (oversized_excerpt is None for one within B), ascending
        snap.forms = {p: f for p in over if (f := oversized_excerpt(msgs[p], tokens[p], budget, counter)) is not None}
        newest = newest_results(graph)
        for p in newest:  # the agent sees what it answers (§5.9): an excerpt with text, in what its call's message leaves
            if p in snap.forms and snap.forms[p].rendered_as == "placeholder":
                room = (budget - tokens[graph.owner_of[p]]) // len(newest)
                snap.forms[p] = excerpt_for(msgs[p], room, counter)
    count, forms, blocks = counter.count_message, snap.forms, snap.blocks
    for k in {result_block[p] for p in forms if p in result_block}:
        if k not in incomplete:
            costs[k] = sum(count(forms[p]) if p in forms else tokens[p] for p in blocks[k].positions)
    for k in sorted(incomplete):
        costs[k] = block_tokens(graph, blocks[k], signals, forms)
    snap.costs = costs
    return snap


def newest_results(graph: ContextGraph) -> list[int]:
    """Positions of the latest results of the latest assistant message's calls (docs/architecture.md §5.9)."""
    last = next((p for p in range(len(graph) - 1, -1, -1) if graph.messages[p].role == "assistant"), None)
    if last is None:
        return []
    return sorted(q for c in graph.messages[last].tool_calls if (q := graph.result_of.get(c.id)) is not None)


def last_assistant(hist: list[Block]) -> int | None:
    """Graph position of the latest assistant message among ``hist``."""
    return max((b.positions[0] for b in hist if b.role == "assistant"), default=None)


def block_messages(graph: ContextGraph, block: Block) -> list[Message]:
    """The block's messages; a segment block is its piece of the message, marked ``segments``."""
    if block.span is None:
        return [graph.messages[p] for p in block.positions]
    m = graph.messages[block.positions[0]]
    return [m.with_content(m.content[block.span[0]:block.span[1]], "segments")]


def message_chars(m: Message) -> int:
    """Characters of content plus serialized tool calls (name and arguments), §3.1."""
    return len(m.content) + sum(len(c.name) + len(c.arguments) for c in m.tool_calls)


@functools.lru_cache(maxsize=8192)
def _text_identifiers(text: str) -> frozenset[str]:
    return frozenset(identifiers(text))


def block_identifiers(graph: ContextGraph, block: Block) -> set[str]:
    """``I(v)``: identifiers of the block's content and tool calls."""
    out: set[str] = set()
    for m in block_messages(graph, block):
        out |= _text_identifiers(m.content)
        for c in m.tool_calls:
            out |= _text_identifiers(f"{c.name} {c.arguments}")
    return out


def synthetic_results(graph: ContextGraph, p: int) -> list[Message]:
    """The shared synthetic results for calls of the assistant message at ``p`` that have none
    (none for the latest message, whose calls may be in flight)."""
    m = graph.messages[p]
    if m.role != "assistant" or p == len(graph) - 1:
        return []
    return [Message("tool", UNANSWERED.format(id=c.id), tool_call_id=c.id, rendered_as="placeholder")
            for c in m.tool_calls if c.id not in graph.result_of]


def oversized_forms(graph: ContextGraph, budget: int | None, signals: Signals) -> dict[int, Message]:
    """Tool results whose own cost exceeds ``budget`` tokens, each mapped to the shared marked
    excerpt that stands in for it (:func:`~historygraph.render.oversized_excerpt`; ReCAP itself is
    silent), so that such a block can still be selected and the latest one never makes the budget
    too small."""
    count = signals.counter.count_message
    forms = {p: oversized_excerpt(m, count(m), budget, signals.counter)
             for p, m in enumerate(graph.messages) if m.role == "tool"}
    return {p: f for p, f in forms.items() if f is not None}


def block_tokens(graph: ContextGraph, block: Block, signals: Signals, forms: dict[int, Message] | None = None) -> int:
    """Tokens the block costs in a rendering (its messages, with ``forms`` standing in for oversized
    results, and any synthetic results); a segment is charged with a separator and a whole
    message's overhead, an upper bound for its share."""
    count = signals.counter.count_message
    forms = forms or {}
    if block.span is not None:
        m = block_messages(graph, block)[0]
        return count(m.with_content(m.content + SEGMENT_JOIN, "segments"))
    return sum(count(forms.get(p, graph.messages[p])) + sum(count(s) for s in synthetic_results(graph, p))
               for p in block.positions)


def block_costs(graph: ContextGraph, blocks: list[Block], signals: Signals,
                forms: dict[int, Message] | None = None) -> dict[int, int]:
    """``{block id: block_tokens(graph, block, signals, forms)}``, the messages' counts read from
    the per-graph token memo of :mod:`historygraph.render` (the same counts), a block with a
    segment or a synthetic result priced by :func:`block_tokens`."""
    forms = forms or {}
    count = signals.counter.count_message
    tokens = token_memo(graph, signals.counter, placeholder_for).tokens
    msgs = graph.messages
    out: dict[int, int] = {}
    for b in blocks:
        if b.span is not None or (b.role == "assistant" and len(b.positions) - 1 != len(msgs[b.positions[0]].tool_calls)):
            out[b.id] = block_tokens(graph, b, signals, forms)
        else:
            out[b.id] = sum(count(forms[p]) if p in forms else tokens[p] for p in b.positions)
    return out


def served_positions(graph: ContextGraph, served: list[Block]) -> list[int]:
    """Graph positions of a served context: the system messages and the served blocks' messages
    (a segment block stands for its whole message here: the proxy reads whole messages)."""
    return sorted({p for p, m in enumerate(graph.messages) if m.role == "system"} | {p for b in served for p in b.positions})
