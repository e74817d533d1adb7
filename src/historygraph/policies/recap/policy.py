"""ReCAP: a persistent context graph of blocks with attention-derived importance and dependency edges.

Source: ReCAP, "Persistent Context Graphs for Efficient Memory Compaction in LLM Agents". Section numbers below are the paper's.

**Blocks (§3.1).** The selectable units ``V_t`` are a user message, an assistant message together
with its tool calls and their results, and a plain assistant message; system messages are not
blocks. Block ids are stable and chronological (the order of each block's first message). A block's
cost ``c(v)`` is the characters of its messages' content plus its calls' names and arguments; a
block's token cost is what the shared :class:`~historygraph.signals.tokens.TokenCounter` charges.
Whole blocks are kept or left out, so tool calls stay paired with their results.

**Budgets.** ``unit="chars"``: the packing budget is ``B_t = floor(β·c(V_t))`` characters (β = 0.1,
§4.1). ``unit="tokens"`` (default, for comparisons at equal token budgets): ``B_t`` is
``pack_fraction·B`` tokens of the budget ``B`` handed to :meth:`Recap.render`. In both units the
token budget ``B`` is a hard cap that no rendering exceeds (docs/architecture.md, invariant §5.1): protected blocks beyond
the mandatory ones, packing and the ``(1+δ)·B_t`` expansion are all also bounded in tokens, by
``(1+δ)·pack_fraction·B ≤ B``. The rest of ``B`` is room for the turn to grow: blocks appended
after a compaction stay until the rendering would exceed ``B``, which forces a compaction
mid-turn (the paper never compacts inside a turn; a hard token budget has to).

**Graph state (§3.2)** per session (:class:`SessionState`): importance ``u(v)`` (EMA, new blocks 0,
blocks outside ``R_t`` keep their score), dependency edges ``w(a, b)``, observed set ``O_t`` and
stale set ``S_t``. It is updated at each compaction from attention over the user turns completed
since the previous one (:mod:`historygraph.signals.attention`), so the proxy model runs once per
completed user turn, never per tool step, and only when a compaction needs the graph (lazily: a
session that always fits in ``B`` never loads the model). With ``measure_mid_turn`` a
budget-forced compaction also measures the segment since the previous measurement, so that a
session of one long user turn (mini-swe-agent) gets attention too; that costs one proxy forward
pass per forced compaction and is off by default.

**Score (§3.3)**: ``s(v) = z(u)(v) + λ·z(r)(v) + ξ_{t,v}·[v ∉ O_t] − κ·[v ∈ S_t]`` with ``r`` the
IDF identifier overlap with the request (:mod:`historygraph.signals.identifiers`).

**Selection (§3.3, §4.4).** Protected set ``P_t`` (all user blocks and the latest edit/write block
per modified file), then blocks by descending score (ties: older first) within ``B_t``, then a
one-hop dependency expansion from that seed set within ``(1+δ)·B_t`` skipping stale blocks, rendered
chronologically between the system messages and the current user message. The selection is
fixed across the tool steps of a user turn; at an idle boundary a new selection is made, at a warm
boundary (drawn with probability ``warm_probability`` from a session-and-turn seed, §5.3) the
new turn is appended to the previous rendering.

Defaults where the paper gives no value (chosen a priori, not tuned on the evaluation traces):
``ema_rate`` α = 0.5 (the newest turn weighs as much as all earlier ones together); ``theta`` θ =
0.1 (a supporting block holds at least a tenth of the dependent block's clipped attention, i.e.
well above the uniform share of a context of dozens of blocks); ``lam`` λ = 1 (request relevance
and history weigh the same after standardisation); ``kappa`` κ = 1 (one standard deviation);
``delta`` δ = 0.2; ``stale_overlap`` = 0.5 (an earlier block is stale when at least half of its
identifiers recur in a later, more important block); ``pack_fraction`` = 0.5. Proxy window, rows
and layers: :mod:`historygraph.signals.attention`.

Deviations, each needed by the shared invariants: the first user message and the latest assistant
block are mandatory (a budget that cannot hold them raises
:class:`~historygraph.render.BudgetTooSmallError`); other protected blocks are kept newest first
while the protected set stays within ``(1+δ)·B_t`` tokens; a history that fits in ``B`` is returned
unchanged (docs/architecture.md, invariant §5.5); a call without a recorded result gets the shared synthetic result; a
tool result whose own cost exceeds ``B`` is shown as the shared marked head-and-tail excerpt
(:func:`oversized_forms`) and its block is charged for the excerpt.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import math
import pickle
import random
import re
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.render import (SEGMENT_JOIN, UNANSWERED, BudgetTooSmallError, Rendering, dropped_marker,
                                 kept_render_order, loop_guard, loop_opening, oversized_excerpt, placeholder_for)
from historygraph.render._memo import token_memo
from historygraph.render.order import loop_bounds
from historygraph.signals.attention import AttentionSource, MessageAttention, ProxyAttention, consolidate
from historygraph.signals.identifiers import identifiers, idf_overlap
from historygraph.policies.base import Signals, register

SOURCE = "ReCAP §3.1–3.3, §4.1, §4.4, §5.3"


@dataclass(frozen=True)
class RecapConfig:
    """ReCAP parameters (defaults and their reasons in the module docstring)."""

    unit: str = "tokens"
    beta: float = 0.1
    pack_fraction: float = 0.5
    ema_rate: float = 0.5
    theta: float = 0.1
    lam: float = 1.0
    kappa: float = 1.0
    delta: float = 0.2
    stale_overlap: float = 0.5
    warm_probability: float = 0.0
    attention: str = "proxy"
    segment: str = "message"
    use_graph: bool = True
    measure_mid_turn: bool = False
    window_tokens: int = 512
    sample_rows: int = 32
    clip_quantile: float = 0.99

    def __post_init__(self) -> None:
        if self.unit not in ("tokens", "chars"):
            raise ValueError(f"ReCAP config: unit must be 'tokens' or 'chars', got {self.unit!r}")
        if self.segment not in ("message", "paragraph", "line"):
            raise ValueError(f"ReCAP config: segment must be 'message', 'paragraph' or 'line', got {self.segment!r}")
        if self.attention not in ("proxy", "none"):
            raise ValueError(f"ReCAP config: attention must be 'proxy' or 'none', got {self.attention!r}")
        if not 0 < self.beta <= 1 or not 0 < self.ema_rate <= 1 or not 0 <= self.warm_probability <= 1:
            raise ValueError("ReCAP config: beta and ema_rate must be in (0, 1], warm_probability in [0, 1]")
        if self.delta < 0 or not 0 < self.pack_fraction * (1 + self.delta) <= 1:
            raise ValueError("ReCAP config: need delta ≥ 0 and 0 < pack_fraction·(1+delta) ≤ 1")


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


_BLOCKS: "weakref.WeakKeyDictionary[ContextGraph, dict[str, _BlockIndex]]" = weakref.WeakKeyDictionary()
_BLOCKS_LOCK = threading.Lock()


@dataclass
class _Blocks:
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


def indexed_blocks(graph: ContextGraph, segment: str, budget: int | None, signals: Signals) -> _Blocks:
    """``build_blocks(graph, segment)``, ``oversized_forms(graph, budget, signals)`` and
    ``block_costs`` of them, from the per-graph :class:`_BlockIndex` (the same values: the
    token counts are the per-graph memo's, as :func:`block_costs` reads them)."""
    memo = token_memo(graph, signals.counter, placeholder_for)
    tokens = memo.tokens
    with _BLOCKS_LOCK:
        index = _BLOCKS.setdefault(graph, {}).get(segment)
        if index is None:
            index = _BLOCKS[graph][segment] = _BlockIndex(segment)
        index.update(graph)
        snap = _Blocks(list(index.blocks), list(index.firsts), list(index.users), list(index.systems),
                       list(index.tools), [], {}, index.steps)
        costs = index.costs(graph, signals, tokens, memo)
        over = index.over(tokens, memo, budget) if budget is not None else []
        incomplete, result_block = set(index.incomplete), index.result_block  # (replaced, not changed, on a rebuild)
    msgs, counter = graph.messages, signals.counter
    if budget is not None:  # the oversized results (oversized_excerpt is None for one within B), ascending
        snap.forms = {p: f for p in over if (f := oversized_excerpt(msgs[p], tokens[p], budget, counter)) is not None}
    count, forms, blocks = counter.count_message, snap.forms, snap.blocks
    for k in {result_block[p] for p in forms if p in result_block}:
        if k not in incomplete:
            costs[k] = sum(count(forms[p]) if p in forms else tokens[p] for p in blocks[k].positions)
    for k in sorted(incomplete):
        costs[k] = block_tokens(graph, blocks[k], signals, forms)
    snap.costs = costs
    return snap


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


_EDIT_TOOL = re.compile(r"edit|write|create|replace|insert|patch", re.I)
_PATH_KEYS = ("path", "file", "file_path", "filename", "target_file")
_SHELL_WRITE = re.compile(r"(?:>>?|\btee\s+(?:-a\s+)?)\s*([\w./-]+\.\w+)|\bsed\s+-i\S*\s+(?:'[^']*'|\"[^\"]*\"|\S+)\s+([\w./-]+)")


def edited_files(message: Message) -> set[str]:
    """Files an assistant message's tool calls edit or write: an edit-like tool's path argument
    (not a ``view`` command), or a shell command's redirect, ``tee`` or ``sed -i`` target."""
    out: set[str] = set()
    for c in message.tool_calls:
        try:
            args = json.loads(c.arguments)
        except ValueError:
            args = {}
        args = args if isinstance(args, dict) else {}
        if _EDIT_TOOL.search(c.name) and args.get("command") != "view":
            out.update(str(args[k]) for k in _PATH_KEYS if isinstance(args.get(k), str))
        cmd = args.get("command") if isinstance(args.get("command"), str) else c.arguments
        for a, b in _SHELL_WRITE.findall(cmd):
            if (a or b) not in ("/dev/null",):
                out.add(a or b)
    return out


def zscore(x: np.ndarray) -> np.ndarray:
    """``(x − mean) / std`` over all entries; zeros when the standard deviation is 0."""
    sd = float(x.std())
    return (x - x.mean()) / sd if sd > 0 else np.zeros_like(x, dtype=float)


def seeded_rng(session_id: str, turn: int) -> random.Random:
    """A generator seeded by session and turn (same draws in every process)."""
    return random.Random(int.from_bytes(hashlib.sha256(f"{session_id}:{turn}".encode()).digest()[:8], "big"))


def exploration_bonus(session_id: str, turn: int, block_ids: list[int]) -> dict[int, float]:
    """ξ_{t,v} ∈ [0.5, 1] for each block id, from a seed fixed by session and turn (§3.3)."""
    rng = seeded_rng(session_id, turn)
    return {b: 0.5 + 0.5 * rng.random() for b in sorted(block_ids)}


@dataclass
class SessionState:
    """Per-session ReCAP state: the graph state of §3.2 plus the fixed selection of the turn.

    ``importance`` block id → u ∈ [0, 1]; ``edges`` (a, b) → w; ``observed`` O_t; ``stale`` S_t.
    ``selection`` is ``None`` until the first compaction, then the selected block ids, which are
    rendered with every block whose first position is ≥ ``append_from``. ``pending`` holds the
    served contexts (block ids, first position of the measured turn) not yet turned into attention.
    """

    first: Message | None = None
    seen: int = 0
    last: Message | None = None
    turn_user: int | None = None
    segment_start: int = 0
    importance: dict[int, float] = field(default_factory=dict)
    edges: dict[tuple[int, int], float] = field(default_factory=dict)
    observed: set[int] = field(default_factory=set)
    stale: set[int] = field(default_factory=set)
    selection: frozenset[int] | None = None
    append_from: int = 0
    omitted: set[int] = field(default_factory=set)
    pending: list[tuple[tuple[int, ...], int]] = field(default_factory=list)

    def graph_bytes(self) -> int:
        """Bytes of the graph state proper (scores, edges, O_t, S_t), pickled: §5.2's memory figure."""
        return len(pickle.dumps((self.importance, self.edges, self.observed, self.stale)))


class Recap:
    """The ReCAP policy (see module docstring). ``source`` overrides the attention source, e.g. a
    :class:`~historygraph.signals.attention.CallerAttention` from a serving engine."""

    Config = RecapConfig

    def __init__(self, name: str = "recap", config: RecapConfig | None = None,
                 source: AttentionSource | None = None) -> None:
        self.name = name
        self.config = config or RecapConfig()
        self.source = source
        self.sessions: dict[str, SessionState] = {}
        self._cache: dict[str, MessageAttention] = {}

    # -- state -----------------------------------------------------------------------------
    def state(self, graph: ContextGraph) -> SessionState:
        """The state of ``graph.session_id``; reset when the graph is not a continuation of it."""
        st = self.sessions.get(graph.session_id)
        msgs = graph.messages
        if st is None or len(msgs) < st.seen or (st.seen and (msgs[0] != st.first or msgs[st.seen - 1] != st.last)):
            st = self.sessions[graph.session_id] = SessionState()
        if msgs:
            st.first, st.seen, st.last = msgs[0], len(msgs), msgs[-1]
        return st

    def _attention_source(self) -> AttentionSource | None:
        if self.source is None and self.config.use_graph and self.config.attention == "proxy":
            self.source = ProxyAttention(self.config.window_tokens, self.config.sample_rows)
        return self.source if self.config.use_graph else None

    def measure(self, graph: ContextGraph, served: list[Block], turn_start: int, signals: Signals) -> MessageAttention | None:
        """Attention of the turn starting at graph position ``turn_start`` over the served blocks
        (with the system messages), per served message; cached by content hash."""
        source = self._attention_source()
        if source is None:
            return None
        positions = served_positions(graph, served)
        msgs = [graph.messages[p] for p in positions]
        start = next((i for i, p in enumerate(positions) if p >= turn_start), len(msgs) - 1)
        cfg = self.config
        h = hashlib.sha256(json.dumps([source.name, cfg.window_tokens, cfg.sample_rows, cfg.clip_quantile, start,
                                       [m.to_dict() for m in msgs]]).encode()).hexdigest()
        got = self._cache.get(h)
        store = signals.store if isinstance(source, ProxyAttention) else None  # caller rows are not persisted
        if got is None and store is not None and (txt := store.get_text("recap-attention", h)) is not None:
            got = MessageAttention(**json.loads(txt))
        if got is None:
            got = consolidate(source.attend(msgs, start), cfg.clip_quantile)
            if store is not None:
                store.put_text("recap-attention", h, json.dumps(got.to_json()))
        self._cache[h] = got
        return got

    def update(self, st: SessionState, graph: ContextGraph, blocks: list[Block], served: list[Block],
               turn_start: int, signals: Signals) -> None:
        """One §3.2 graph update from the completed turn (EMA, edges, O_t, S_t)."""
        att = self.measure(graph, served, turn_start, signals)
        if att is None:
            return
        positions = served_positions(graph, served)
        block_at: dict[int, int] = {}
        for b in served:
            for p in b.positions:
                block_at.setdefault(p, b.id)
        msg_block = [block_at.get(p) for p in positions]
        apply_attention(st, att, msg_block, self.config)
        for b in served:  # segments share their message's figures (the proxy maps tokens to messages)
            first = block_at[b.positions[0]]
            if b.id != first and first in st.observed:
                st.importance[b.id] = st.importance[first]
                st.observed.add(b.id)
        mark_stale(st, {b.id: block_identifiers(graph, b) for b in blocks if b.id in st.observed}, self.config.stale_overlap)

    # -- rendering -------------------------------------------------------------------------
    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        st = self.state(graph)
        ix = indexed_blocks(graph, self.config.segment, budget, signals)
        blocks, users, forms, costs = ix.blocks, ix.users, ix.forms, ix.costs
        current = users[-1] if users else None
        plain = blocks if self.config.segment == "message" else None  # = build_blocks(graph)
        at = bisect.bisect_left(ix.firsts, current) if current is not None else len(blocks)
        if at < len(blocks) and blocks[at].positions[0] == current:  # the current user message's block (one)
            hist = blocks[:at] + blocks[at + 1:]
            current_cost = costs[at]
        else:
            hist, current_cost = blocks, 0
        new_turn = current is not None and current != st.turn_user
        if new_turn:
            if st.turn_user is None and len(users) > 1:  # first render of a session with a completed turn
                st.segment_start = users[-2]
            if st.turn_user is not None or len(users) > 1:
                st.pending.append((served_ids(st, blocks, current, ix.firsts), st.segment_start))
            st.turn_user = st.segment_start = current
        # the whole history's tokens: every block's cost but the current user message's (outside B);
        # a segment's cost is an upper bound, so segmented blocks are assembled to know
        whole_tokens = sum(costs) - current_cost if self.config.segment == "message" else None
        if budget is None or whole_tokens is None or whole_tokens <= budget:
            whole = assemble(self.name, graph, blocks, budget, signals, {"compaction": 0}, forms, plain, ix)
            if budget is None or whole.history_tokens <= budget:
                return whole
        stats: dict[str, Any] = {"compaction": 0}
        if st.selection is not None and not (new_turn and not self._warm(graph, len(users))):
            shown = served_ids(st, blocks, len(graph), ix.firsts)
            kept = assemble(self.name, graph, [blocks[i] for i in shown], budget, signals, stats, forms, plain, ix)
            if kept.history_tokens <= budget:
                return kept
            if self.config.measure_mid_turn:  # the budget forces a compaction mid-turn
                st.pending.append((shown, st.segment_start))
                st.segment_start = len(graph)
        elif st.selection is None and not new_turn and self.config.measure_mid_turn:
            st.pending.append((tuple(b.id for b in blocks), st.segment_start))
            st.segment_start = len(graph)
        t0 = time.perf_counter()
        for ids, start in st.pending:
            self.update(st, graph, blocks, [blocks[i] for i in ids if i < len(blocks)], start, signals)
        st.pending.clear()
        t1 = time.perf_counter()
        cost = dict(enumerate(costs))  # block id -> tokens (select may change an entry)
        chosen = self.select(st, graph, hist, cost, budget, len(users), signals, forms)
        stats.update(compaction=1, attention_s=t1 - t0, selection_s=time.perf_counter() - t1,
                     graph_bytes=st.graph_bytes())
        if st.selection is not None:
            stats["revived"] = int(bool(chosen & st.omitted))
        st.omitted = {b.id for b in hist} - chosen
        st.selection, st.append_from = frozenset(chosen), len(graph)
        current_ids = {b.id for b in blocks if b.positions[0] == current}
        r = assemble(self.name, graph, [blocks[i] for i in sorted(chosen | current_ids)], budget, signals, stats, forms, plain, ix)
        mandatory = self.mandatory(graph, hist)
        while r.history_tokens > budget:  # the dropped-step markers are charged too: give up the oldest choice
            spare = sorted(chosen - mandatory)
            if not spare:
                raise BudgetTooSmallError(budget, r.history_tokens)
            chosen.discard(spare[0])
            st.omitted.add(spare[0])
            st.selection = frozenset(chosen)
            r = assemble(self.name, graph, [blocks[i] for i in sorted(chosen | current_ids)], budget, signals, stats, forms, plain, ix)
        return r

    def _warm(self, graph: ContextGraph, turn: int) -> bool:
        """Whether the boundary before user turn ``turn`` is warm (§5.3: a seeded draw with probability p)."""
        p = self.config.warm_probability
        return p > 0 and seeded_rng(graph.session_id + ":warm", turn).random() < p

    def select(self, st: SessionState, graph: ContextGraph, hist: list[Block], cost: dict[int, int], budget: int,
               turn: int, signals: Signals, forms: dict[int, Message] | None = None) -> set[int]:
        """The §3.3 selection over the history blocks ``hist`` (ids, chronological). The block
        opening the active tool loop with a thinking block is mandatory too
        (:func:`~historygraph.render.loop_opening`); when the mandatory blocks do not fit, its
        results get placeholders in ``forms`` (and ``cost`` is updated)."""
        cfg = self.config
        chars = {b.id: sum(message_chars(m) for m in block_messages(graph, b)) for b in hist}
        pack_tok = int(cfg.pack_fraction * budget)
        grow_tok = min(budget, int((1 + cfg.delta) * pack_tok))
        pack_chr = math.floor(cfg.beta * sum(chars.values())) if cfg.unit == "chars" else None
        grow_chr = math.floor((1 + cfg.delta) * pack_chr) if pack_chr is not None else None
        mandatory = self.mandatory(graph, hist)
        opening = loop_opening(graph)
        open_ids = {b.id for b in hist if b.role == "assistant" and b.positions[0] == opening != last_assistant(hist)}
        need = sum(cost[i] for i in mandatory)
        if need > budget and forms is not None:  # the opening message is protected, not its results
            for b in (b for b in hist if b.id in open_ids):
                forms.update({p: placeholder_for(graph.messages[p], signals.counter) for p in b.positions[1:]})
                need += block_tokens(graph, b, signals, forms) - cost[b.id]
                cost[b.id] = block_tokens(graph, b, signals, forms)
        if need > budget:
            raise BudgetTooSmallError(budget, need)
        chosen, used_tok = set(mandatory), need
        used_chr = sum(chars[i] for i in chosen)
        for i in sorted(protected_set(graph, hist) - chosen, reverse=True):  # newest first
            if used_tok + cost[i] <= grow_tok:
                chosen.add(i)
                used_tok += cost[i]
                used_chr += chars[i]
        score = self.scores(st, graph, hist, turn)
        for i in sorted((b.id for b in hist if b.id not in chosen), key=lambda i: (-score[i], i)):
            if used_tok + cost[i] <= pack_tok and (pack_chr is None or used_chr + chars[i] <= pack_chr):
                chosen.add(i)
                used_tok += cost[i]
                used_chr += chars[i]
        if cfg.use_graph:
            for b in sorted(chosen, key=lambda i: (-score[i], i)):  # one hop from the fixed seed set
                preds = sorted(((w, a) for (a, bb), w in st.edges.items() if bb == b), reverse=True)
                for _, a in preds:
                    if a in chosen or a in st.stale or a not in chars:
                        continue
                    if used_tok + cost[a] <= grow_tok and (grow_chr is None or used_chr + chars[a] <= grow_chr):
                        chosen.add(a)
                        used_tok += cost[a]
                        used_chr += chars[a]
        return chosen

    @staticmethod
    def mandatory(graph: ContextGraph, hist: list[Block]) -> set[int]:
        """Blocks every selection keeps: the first user block, the latest assistant message's
        blocks and the blocks that keep the active tool loop's opening thinking block on the wire
        (:func:`~historygraph.render.loop_guard`, docs/architecture.md, invariant §5.7)."""
        out = set([b.id for b in hist if b.role == "user"][:1])
        keep = {p for p in (last_assistant(hist), *loop_guard(graph)) if p is not None}
        return out | {b.id for b in hist if b.role in ("assistant", "user") and b.positions[0] in keep}

    def scores(self, st: SessionState, graph: ContextGraph, hist: list[Block], turn: int) -> dict[int, float]:
        """``s(v)`` of §3.3 for every history block (the relevance alone without the graph)."""
        users = [m for m in graph.messages if m.role == "user"]
        query = identifiers(users[-1].content) if users else set()
        rel = np.array(idf_overlap(query, [block_identifiers(graph, b) for b in hist]))
        ids = [b.id for b in hist]
        if not self.config.use_graph:
            return dict(zip(ids, rel.tolist()))
        u = np.array([st.importance.get(i, 0.0) for i in ids])
        s = zscore(u) + self.config.lam * zscore(rel)
        xi = exploration_bonus(graph.session_id, turn, [i for i in ids if i not in st.observed])
        return {i: float(s[k]) + xi.get(i, 0.0) - (self.config.kappa if i in st.stale else 0.0)
                for k, i in enumerate(ids)}


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


def served_ids(st: SessionState, blocks: list[Block], end: int, firsts: list[int] | None = None) -> tuple[int, ...]:
    """Blocks rendered to calls before graph position ``end``: all before the first compaction, then
    the fixed selection plus the blocks appended since. ``firsts``: each block's first position
    (ascending, as blocks are chronological), when the caller has them: the blocks are then found
    by bisection, not by a scan."""
    if firsts is None:
        return tuple(b.id for b in blocks if b.positions[0] < end
                     and (st.selection is None or b.id in st.selection or b.positions[0] >= st.append_from))
    stop = bisect.bisect_left(firsts, end)  # blocks[:stop] start before end (ids are indexes)
    if st.selection is None:
        return tuple(range(stop))
    since = min(bisect.bisect_left(firsts, st.append_from), stop)
    return tuple(sorted(i for i in st.selection if i < since)) + tuple(range(since, stop))


def protected_set(graph: ContextGraph, hist: list[Block]) -> set[int]:
    """``P_t`` (§3.3): every user block and the latest block editing or writing each file."""
    latest: dict[str, int] = {}
    for b in hist:
        if b.role == "assistant":
            for f in edited_files(graph.messages[b.positions[0]]):
                latest[f] = b.id
    return {b.id for b in hist if b.role == "user"} | set(latest.values())


def apply_attention(st: SessionState, att: MessageAttention, msg_block: list[int | None], cfg: RecapConfig) -> None:
    """Importance EMA, dependency edges and O_t from one turn's attention (§3.2).

    ``msg_block[m]`` is the block of served message ``m`` (``None`` for system messages).
    ``ρ̄(v)`` = Σ ρ over the block's window tokens / their number; ``R_t`` = blocks with tokens in the
    window; ``u(v) ← (1−α)·u(v) + α·ρ̄(v)/max_{R_t} ρ̄`` for v ∈ R_t, others unchanged. An edge
    ``(a, b)`` gets ``w = max(w, mass)`` when the mean mass of b's rows on a's tokens exceeds θ.
    """
    rho: dict[int, float] = {}
    ntok: dict[int, int] = {}
    for m, b in enumerate(msg_block):
        if b is not None and att.n_tokens[m] > 0:
            rho[b] = rho.get(b, 0.0) + att.rho_sum[m]
            ntok[b] = ntok.get(b, 0) + att.n_tokens[m]
    rbar = {b: rho[b] / ntok[b] for b in rho}
    top = max(rbar.values(), default=0.0)
    for b, r in rbar.items():
        u = r / top if top > 0 else 0.0
        st.importance[b] = (1 - cfg.ema_rate) * st.importance.get(b, 0.0) + cfg.ema_rate * u
    st.observed |= set(rbar)
    rows: dict[int, list[int]] = {}
    for i, m in enumerate(att.row_message):
        if 0 <= m < len(msg_block) and msg_block[m] is not None:
            rows.setdefault(msg_block[m], []).append(i)
    for b, idx in rows.items():
        mass: dict[int, float] = {}
        for m, a in enumerate(msg_block):
            if a is not None and a < b:
                mass[a] = mass.get(a, 0.0) + sum(att.row_mass[i][m] for i in idx) / len(idx)
        for a, w in mass.items():
            if w > cfg.theta:
                st.edges[(a, b)] = max(st.edges.get((a, b), 0.0), w)


def mark_stale(st: SessionState, idents: dict[int, set[str]], threshold: float, min_identifiers: int = 3) -> None:
    """Recompute ``S_t`` (§3.2): an observed block ``a`` with at least ``min_identifiers`` identifiers
    is stale when a later observed block ``b`` with ``u(b) > u(a)`` contains at least ``threshold``
    of ``a``'s identifiers."""
    ids = sorted(idents)
    st.stale = set()
    for k, a in enumerate(ids):
        ia = idents[a]
        if len(ia) < min_identifiers:
            continue
        for b in ids[k + 1:]:
            if st.importance.get(b, 0.0) > st.importance.get(a, 0.0) and len(ia & idents[b]) >= threshold * len(ia):
                st.stale.add(a)
                break


def assemble(name: str, graph: ContextGraph, shown: list[Block], budget: int | None, signals: Signals,
             stats: dict[str, Any], forms: dict[int, Message] | None = None,
             plain: list[Block] | None = None, index: _Blocks | None = None) -> Rendering:
    """Render the ``shown`` blocks chronologically with the system messages (current user message
    and system messages outside ``B``); results of other blocks are omitted, their messages dropped;
    a shown result in ``forms`` (:func:`oversized_forms`) is rendered as its excerpt and counted as omitted.
    ``plain``: ``build_blocks(graph)`` when the caller has it (the reasons name those blocks);
    ``index``: the graph's :func:`indexed_blocks` (the positions by role, found by a scan otherwise)."""
    forms = forms or {}
    if index is not None:
        systems, users, tools = index.systems, index.users, index.tools
    else:
        systems = [p for p, m in enumerate(graph.messages) if m.role == "system"]
        users = [p for p, m in enumerate(graph.messages) if m.role == "user"]
        tools = [p for p, m in enumerate(graph.messages) if m.role == "tool"]
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
    # positions), found for all entries at once; a kept message that is not a result closes the run
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
    walked = 0
    for p, gone_before in zip(order_arr[kept_here].tolist(), np.cumsum(gone)[kept_here].tolist()):
        if gone_before > walked:
            run.extend(gone_steps[walked:gone_before])  # type: ignore[arg-type]  # (no None left)
            walked = gone_before
        if msgs[p].role != "tool":
            mark()
        m = forms.get(p, graph.messages[p])
        if p in pieces and len(pieces[p]) < pieces[p][0].pieces:
            m = m.with_content(SEGMENT_JOIN.join(m.content[a:b] for a, b in sorted(x.span for x in pieces[p])), "segments")
        out.append(m)
        positions.append(p)
        history += 0 if p in outside else count(m)
        for s in synthetic_results(graph, p):
            out.append(s)
            positions.append(None)
            history += count(s)
    run.extend(gone_steps[walked:])  # type: ignore[arg-type]
    mark()
    n = len(graph)
    if plain is None:
        plain = build_blocks(graph)

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
    r.defer_reasons(reasons)
    return r


register("recap", SOURCE, "Blocks scored by attention importance (SmolLM2 proxy) + IDF identifier relevance; "
         "protected set, packing, one-hop dependency expansion; fixed within a user turn.")(Recap)
register("recap-paragraph", "ReCAP §4.4 (paragraph segmentation)",
         "ReCAP ablation: plain assistant messages split into paragraph blocks (fenced code kept whole).",
         segment="paragraph")(Recap)
register("recap-line", "ReCAP §4.4 (line segmentation)",
         "ReCAP ablation: plain assistant messages split into line blocks (fenced code kept whole).",
         segment="line")(Recap)
register("recap-noattn", "ReCAP §4.4 (without the attention graph)",
         "ReCAP ablation: protected set, then blocks by IDF identifier overlap with the request; no model.",
         use_graph=False)(Recap)
