"""ReCAP's graph state (§3.2) per session and its updates from attention: importance ``u(v)`` (an
EMA over the user turns measured), dependency edges ``w(a, b)`` above θ, the observed set ``O_t``
and the stale set ``S_t``; and which blocks a session's earlier calls were served (the contexts the
attention is measured over)."""

from __future__ import annotations

import bisect
import pickle
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from historygraph.history.events import Message
from historygraph.policies.recap.blocks import Block
from historygraph.signals.attention import MessageAttention

if TYPE_CHECKING:
    from historygraph.policies.recap.policy import RecapConfig


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
        if 0 <= m < len(msg_block) and (blk := msg_block[m]) is not None:
            rows.setdefault(blk, []).append(i)
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
