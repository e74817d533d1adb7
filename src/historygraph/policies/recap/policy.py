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
(:func:`~historygraph.policies.recap.blocks.oversized_forms`) and its block is charged for the excerpt.

Modules: :mod:`~historygraph.policies.recap.blocks` (blocks and their costs, per graph),
:mod:`~historygraph.policies.recap.importance` (the graph state of §3.2 and its updates),
:mod:`~historygraph.policies.recap.selection` (protected set, z-scores, exploration bonus),
:mod:`~historygraph.policies.recap.assemble` (the rendering of the shown blocks) and this one (the
configuration, the policy and its registered variants).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.policies.base import Signals
from historygraph.policies.registry import register
from historygraph.policies.recap.assemble import assemble
from historygraph.policies.recap.blocks import (Block, block_identifiers, block_messages, block_tokens, indexed_blocks,
                                                last_assistant, message_chars, newest_results, served_positions)
from historygraph.policies.recap.importance import SessionState, apply_attention, mark_stale, served_ids
from historygraph.policies.recap.selection import exploration_bonus, protected_set, seeded_rng, zscore
from historygraph.render import EXCERPT_MARK, BudgetTooSmallError, Rendering, loop_guard, loop_opening, placeholder_for
from historygraph.render.plan import latest_plan
from historygraph.signals.attention import AttentionSource, MessageAttention, ProxyAttention, consolidate
from historygraph.signals.identifiers import identifiers, idf_overlap

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
        """ReCAP's rendering (§3.3); raises BudgetTooSmallError when a result of the latest
        assistant message cannot be shown even as an excerpt with some text (docs/architecture.md §5.9)."""
        r = self._render(graph, budget, signals)
        shown = dict(zip(r.positions, r.messages))
        pins = [graph.item_id(p) for p in graph.pinned()] if graph.pins else []
        if budget is not None and pins:  # a pinned result in a mandatory block, cut to its excerpt (larger than B)
            short = [p for p in graph.pinned() if p in shown and graph.messages[p].role == "tool"
                     and shown[p].content != graph.messages[p].content]
            if short:
                count = signals.counter.count_message
                raise BudgetTooSmallError(budget, max(budget + 1, r.history_tokens + sum(
                    count(graph.messages[p]) - count(shown[p]) for p in short)), pins)
        bad = [p for p in newest_results(graph) if p in shown and shown[p].rendered_as == "placeholder"]
        if budget is not None and bad:
            count = signals.counter.count_message
            least = sum(count(graph.messages[p].with_content(EXCERPT_MARK.format(id=graph.messages[p].tool_call_id, kept=8, total=8),
                                                            "excerpt")) + 8 - count(shown[p]) for p in bad)
            raise BudgetTooSmallError(budget, max(budget + 1, r.history_tokens + least), pins)
        return r

    def _render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
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
        if new_turn and current is not None:  # (new_turn implies it)
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
        if st.selection is not None and not (new_turn and not self._warm(graph, len(users))) \
                and self.pinned_blocks(graph, hist).issubset(shown := served_ids(st, blocks, len(graph), ix.firsts)):
            # (the fixed selection, unless an item pinned since is not in it)
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
                raise BudgetTooSmallError(budget, r.history_tokens, [graph.item_id(p) for p in graph.pinned()])
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
            raise BudgetTooSmallError(budget, need, [graph.item_id(p) for p in graph.pinned()])
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
            for seed in sorted(chosen, key=lambda i: (-score[i], i)):  # one hop from the fixed seed set
                preds = sorted(((w, a) for (a, bb), w in st.edges.items() if bb == seed), reverse=True)
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
        blocks, the blocks that keep the active tool loop's opening thinking block on the wire
        (:func:`~historygraph.render.loop_guard`, docs/architecture.md, invariant §5.7), the block
        of the agent's latest plan (:func:`~historygraph.render.plan.latest_plan`, §5.10) and the
        blocks of the pinned items (a pinned result's: its call's, docs/architecture.md, "Pins")."""
        out = set([b.id for b in hist if b.role == "user"][:1])
        keep = {p for p in (last_assistant(hist), *loop_guard(graph), latest_plan(graph)) if p is not None}
        return out | {b.id for b in hist if b.role in ("assistant", "user") and b.positions[0] in keep} | \
            Recap.pinned_blocks(graph, hist)

    @staticmethod
    def pinned_blocks(graph: ContextGraph, hist: list[Block]) -> set[int]:
        """The blocks of the pinned items (a pinned result's: its call's message's block)."""
        if not graph.pins:
            return set()
        keep = {graph.owner_of.get(p, p) for p in graph.pinned()}
        return {b.id for b in hist if b.positions[0] in keep}

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


# what the proxy model costs, said where a user chooses the policy (docs/recap.md: 2.3 s per 512-token update on
# 2 idle cores, 8-14 s under load)
SLOW = " Slow on CPU: a SmolLM2 forward pass per user turn's compaction, seconds each (docs/recap.md)."
register("recap", SOURCE, "Blocks scored by attention importance (SmolLM2 proxy) + IDF identifier relevance; "
         "protected set, packing, one-hop dependency expansion; fixed within a user turn." + SLOW)(Recap)
register("recap-paragraph", "ReCAP §4.4 (paragraph segmentation)",
         "ReCAP ablation: plain assistant messages split into paragraph blocks (fenced code kept whole)." + SLOW,
         segment="paragraph")(Recap)
register("recap-line", "ReCAP §4.4 (line segmentation)",
         "ReCAP ablation: plain assistant messages split into line blocks (fenced code kept whole)." + SLOW,
         segment="line")(Recap)
register("recap-noattn", "ReCAP §4.4 (without the attention graph)",
         "ReCAP ablation: protected set, then blocks by IDF identifier overlap with the request; no model.",
         use_graph=False)(Recap)
