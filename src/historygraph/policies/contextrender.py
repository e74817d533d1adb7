"""ContextRender: usefulness-scored greedy selection of complete tool results under B.

Source: ContextRender, "ContextRender: From Execution Dependencies to Agent Context", arXiv:2609.37743 §3.3, Appendix A.1 (Algorithm 1), A.3, A.4.

1. If the complete history fits in B it is returned unchanged (Algorithm 1, lines 6–7).
2. Query vector (eq. 4): ``q_t = 0.4·unit(emb(x)) + 0.6·unit(emb(f_t))`` where ``x`` is the first
   user message clipped to 2,000 characters and ``f_t`` the latest user message followed by the
   latest assistant message. Results are embedded from their first 8,000 characters.
   ``f_t`` is clipped to 8,000 characters as well (our choice: the encoder reads at most 256
   word pieces anyway).
3. Relevance (eq. 5): ``s_t(r) = max(cos(emb(r), q_t), 0)``.
4. Usefulness (eq. 2): ``U = W_rec·e^{−λ·a} + W_reuse·(1 − e^{−γ·c}) + W_rel·s`` with
   ``W_rec = W_reuse = W_rel = 1``, ``λ = 0.3``, ``γ = 0.2`` (A.3); ``a`` is the age in turns and ``c``
   the TFA reuse score of eq. 1 (:mod:`historygraph.history.reuse`).
5. Greedy selection (A.4, eq. 6–7): start from S = ∅; among results whose addition keeps the
   assembled history within B, take the one with the highest ``R = U − 0.5·D(r, S)``, where
   ``D(r, S) = max(0, max_{r'∈S} cos(emb(r), emb(r')))``. Candidates are visited in transcript
   order and the best is replaced only by a strictly higher score, so exact ties go to the older
   result. A result that does not fit is skipped; there is no minimum score. Output is
   chronological.
6. Oversized-result fallback (A.4): a result whose own cost exceeds B is replaced, as a
   candidate, by a compacted version. With no LLM configured this is a head-and-tail excerpt of
   ``oversized_excerpt_fraction·B`` tokens that says it is truncated and names the result id;
   the original stays stored. An excerpt never counts as the complete result. (Implemented in
   :class:`~historygraph.render.Layout`, so every policy gets the same fallback.)

Budget accounting, placeholders for unselected results, and dropping of the oldest non-tool
history when it alone exceeds B are shared with every policy (:mod:`historygraph.render`).
The ablations of B.3 are registered as separate names with the omitted weights set to 0.

Beyond the paper (``w_dep``, default 0: off): ``U' = U + w_dep·1[r belongs to an ancestor of the
current step]``, the ancestry being ContextWeaver's low-cost parents and breadth-first search
bounded by ``dep_ancestors`` steps (:func:`dependency_results`); registered as
``contextrender-dep`` (w_dep = 0.5, W = 10).

Beyond the paper, the layout (``result_reserve``, default 0.5, and ``brief_revivals``, default off:
the shared layout above): registered as ``contextrender-reserve`` (0.95 and on, the layout of the
``learned`` policy, chosen by its cross-validation on 90 mini-swe-agent training trajectories), the same
selection with the non-tool history kept only within ``(1 − result_reserve)·B`` and each step
brought back for a result shown with its tool calls and a marker in place of its text
(:class:`~historygraph.render.Layout`).
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
import weakref
from dataclasses import dataclass
from typing import cast

import numpy as np

from historygraph.history.derived import DerivedKind
from historygraph.history.graph import ContextGraph
from historygraph.render import Layout, Rendering, Selection
from historygraph.signals.embeddings import CachedEmbedder
from historygraph.signals.steps.view import latest_ancestry_results
from historygraph.policies.base import Signals
from historygraph.policies.registry import register

SOURCE = "ContextRender §3.3, A.1–A.4"


@dataclass(frozen=True)
class ContextRenderConfig:
    """Parameters of eq. 2, eq. 4 and eq. 7; defaults from ContextRender A.3 and A.4.

    ``result_reserve`` (share of B, in [0, 1)), ``brief_revivals`` and ``excerpt_focus`` (excerpts
    keep the lines holding the values of this many latest assistant messages; 0: head and tail,
    docs/policies.md "Focused excerpts") are the :class:`~historygraph.render.Layout` options; their
    defaults (0.5, off, 3) are the shared layout the paper's policy uses. Raises ``ValueError`` for a negative weight or an out-of-range share.
    """

    w_rec: float = 1.0
    w_reuse: float = 1.0
    w_rel: float = 1.0
    lam: float = 0.3
    gamma: float = 0.2
    task_weight: float = 0.4
    latest_weight: float = 0.6
    task_clip_chars: int = 2000
    result_clip_chars: int = 8000
    similarity_penalty: float = 0.5
    oversized_excerpt_fraction: float = 0.25
    w_dep: float = 0.0
    dep_ancestors: int = 3
    result_reserve: float = 0.5
    brief_revivals: bool = False
    excerpt_focus: int = 3

    def __post_init__(self) -> None:
        for name in ("w_rec", "w_reuse", "w_rel", "lam", "gamma", "similarity_penalty", "w_dep", "dep_ancestors"):
            if getattr(self, name) < 0:
                raise ValueError(f"ContextRender config: {name} must be ≥ 0, got {getattr(self, name)}")
        if not 0 < self.oversized_excerpt_fraction <= 1:
            raise ValueError("ContextRender config: oversized_excerpt_fraction must be in (0, 1]")
        if not (isinstance(self.excerpt_focus, int) and self.excerpt_focus >= 0):
            raise ValueError(f"ContextRender config: excerpt_focus must be a whole number ≥ 0, got {self.excerpt_focus}")
        if not 0 <= self.result_reserve < 1:
            raise ValueError(f"ContextRender config: result_reserve must be in [0, 1), got {self.result_reserve}")


def usefulness(age: int, reuse: float, relevance: float, cfg: ContextRenderConfig) -> float:
    """Eq. 2 of ContextRender: ``W_rec e^{−λa} + W_reuse (1 − e^{−γc}) + W_rel s``."""
    return (cfg.w_rec * math.exp(-cfg.lam * age) + cfg.w_reuse * (1.0 - math.exp(-cfg.gamma * reuse))
            + cfg.w_rel * relevance)


def query_texts(graph: ContextGraph, cfg: ContextRenderConfig,
                at: tuple[int | None, int | None, int | None] | None = None) -> tuple[str, str]:
    """``(x, f_t)`` of eq. 4: first user message (clipped) and latest user + assistant messages.
    ``at``: the positions of those three messages (``None`` for none) when the caller has them (a
    layout's ``first_user``, ``current_user`` and ``last_assistant``); found by scanning the
    history otherwise (O(n): a long tool loop holds no user message after the first)."""
    msgs = graph.messages
    if at is None:
        first_user = next((m for m in msgs if m.role == "user"), None)
        last_user = next((m for m in reversed(msgs) if m.role == "user"), None)
        last_assistant = next((m for m in reversed(msgs) if m.role == "assistant"), None)
    else:
        first_user, last_user, last_assistant = (msgs[p] if p is not None else None for p in at)
    x = first_user.content[:cfg.task_clip_chars] if first_user else ""
    latest = []
    if last_user:
        latest.append(last_user.content)
    if last_assistant:
        a = last_assistant
        latest.append("\n".join([a.content] + [f"{c.name} {c.arguments}" for c in a.tool_calls]))
    return x, "\n".join(latest)[:cfg.result_clip_chars]


def greedy_select(candidates: list[int], score: dict[int, float] | None, sel: Selection,
                  vectors: dict[int, np.ndarray] | None, penalty: float, *,
                  arrays: tuple[np.ndarray, np.ndarray] | None = None) -> list[int]:
    """Algorithm 1 lines 15–20 with eq. 6–7; fills ``sel`` and returns positions in selection order.

    Each pick takes, among the remaining candidates that fit, the highest ``R = U − penalty·D``;
    candidates are in transcript order and ``argmax`` returns the first maximum, which is the
    loop's strictly-higher replacement (exact ties go to the older result). Vectorised: costs,
    ``R`` and ``D(r, S)`` are arrays. For the layout's own candidates, costs start as lower bounds
    (:meth:`~historygraph.render.Selection.lower_costs`, exact but for results of dropped steps):
    the best candidate by ``R`` among those whose bound fits is priced exactly and taken if it fits,
    else left out of this pick, so the pick is the loop's. Otherwise every cost is exact, and after
    a pick only the costs of results of dropped steps are recomputed. ``arrays``: the scores and
    the vectors (one row per candidate) as arrays, in place of ``score`` and ``vectors``.

    Lazy penalty: ``D(r, S)`` is a max over S, so it only grows as S does and a candidate's last
    computed ``R`` bounds its ``R`` now from above. When the leading ``R`` is such a bound, the
    leading bounds (``_CATCH_UP`` of them, doubling while a bound still leads) are brought up to
    date over the picks they missed, and the argmax is taken again; a pick is made only when the
    leader's ``R`` is exact. As no bound is below the true value, and ``argmax`` still breaks
    ties by position, the picks are those of updating every candidate after each pick; each
    cosine is the same einsum row as there, so the values are bit for bit the same.
    """
    # (over 80 lines: the vectorised pick loop with its arrays in locals; its equality with Algorithm 1's plain loop is tested, tests/test_equivalence.py)
    n = len(candidates)
    if not n:
        return []
    lay = sel.layout
    budget = lay.budget
    cand = np.asarray(candidates)
    if arrays is not None:
        s, V = arrays
    else:
        assert score is not None and vectors is not None
        s = np.fromiter((score[p] for p in candidates), dtype=np.float64, count=n)
        V = np.stack([vectors[p] for p in candidates])
    bounded = candidates is lay.candidates or candidates == lay.candidates
    cost = sel.lower_costs() if bounded else np.fromiter((sel.cost(p) for p in candidates), dtype=np.int64, count=n)
    unit = lay._candidate_arrays()[1] if bounded else \
        np.fromiter((lay.unit_of[p] for p in candidates), dtype=np.int64, count=n)
    sim = np.zeros(n)  # D(r, S) over the first seen[j] picks, floored at 0: a lower bound of D
    seen = np.zeros(n, dtype=np.int64)
    picks: list[int] = []  # rows of the picks, in order
    left = np.ones(n, dtype=bool)
    selected: list[int] = []

    def catch_up(rows: np.ndarray) -> None:  # D(r, S) of ``rows`` over every pick so far
        # row by row with one kernel (einsum, not BLAS gemv, whose rounding depends on the row's
        # place in a block): identical results get identical similarities, so exact ties stay ties
        have = seen[rows]
        for k in range(int(have.min()), len(picks)):
            sub = rows[have <= k]
            sim[sub] = np.maximum(sim[sub], np.einsum("ij,j->i", V[sub], V[picks[k]]).astype(np.float64))
        seen[rows] = len(picks)

    while True:
        room = None if budget is None else budget - sel.used
        ok = left if room is None else left & (cost <= room)
        # R = U − penalty·D, exact where seen == len(picks), else an upper bound (D only grows)
        r = np.where(ok, s - penalty * sim, -np.inf)
        batch = _CATCH_UP
        while True:
            if not ok.any():
                return selected
            i = int(np.argmax(r))
            if seen[i] < len(picks):  # a bound leads: make the leading bounds exact, then look again
                stale = (ok & (seen < len(picks))).nonzero()[0]
                if len(stale) > batch:
                    stale = stale[np.argpartition(-r[stale], batch)[:batch]]
                    batch *= 2
                catch_up(stale)
                r[stale] = s[stale] - penalty * sim[stale]
                continue
            if room is None or not bounded:
                break
            cost[i] = sel.exact_cost(int(cand[i]))  # (kept: exact until the next revival)
            if cost[i] <= room:
                break
            ok[i] = False  # its bound fits, the exact cost does not
            r[i] = -np.inf
        best = int(cand[i])
        selected.append(best)
        left[i] = False
        picks.append(i)
        v = int(unit[i])
        revives = v in lay.dropped_units and v not in sel.revived
        a = sel.runs.start.get(v, v)
        b = sel.runs.end[a] if a in sel.runs.end else v
        sel.take(best)
        if revives:  # its other results no longer pay for the step, and the markers around it change
            if bounded:  # only the costs of results of the steps of its marker's run change: bounds again
                again = (unit >= a) & (unit <= b)
                cost[again] = sel.lower_costs()[again]
            else:
                for j in np.flatnonzero(left & np.isin(unit, list(lay.dropped_units))):
                    cost[j] = sel.cost(int(cand[j]))


_CATCH_UP = 32  # bounds made exact at once when one leads (doubling while bounds keep leading)


def dependency_results(graph: ContextGraph, max_ancestors: int) -> set[int]:
    """Positions of the tool results of the current step's ancestors: ContextWeaver's low-cost
    parents (§3.3) and breadth-first ancestry bounded by ``max_ancestors`` (§3.1); ours to combine
    them with eq. 2 (see :func:`historygraph.signals.steps.view.ancestry`); read from the kept step view
    without copying it."""
    return set(latest_ancestry_results(graph, max_ancestors))


class ContextRender:
    """The ContextRender policy (see module docstring)."""

    Config = ContextRenderConfig

    def __init__(self, name: str = "contextrender", config: ContextRenderConfig | None = None) -> None:
        self.name = name
        self.config = config or ContextRenderConfig()

    def prefetch(self, graph: ContextGraph, signals: Signals) -> None:
        """Embed the query texts ``x`` and ``f_t`` (eq. 4) of ``graph`` as it stands, into the
        embedder's cache. The proxy calls it once an answer is stored, off the request path: when
        the next request only adds tool results, its render embeds the same ``f_t``. Changes
        nothing a render returns."""
        signals.embedder.embed(list(query_texts(graph, self.config)))

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        cfg = self.config
        layout = Layout(graph, signals.counter, budget, excerpt_fraction=cfg.oversized_excerpt_fraction,
                        result_reserve=cfg.result_reserve, brief_revivals=cfg.brief_revivals, excerpt_focus=cfg.excerpt_focus)
        msgs = graph.messages
        if layout.fits_in_full:
            return layout.assemble_full(self.name)
        cands = layout.candidates
        x, f = query_texts(graph, cfg, (layout.first_user, layout.current_user, layout.last_assistant))
        V, xf = result_vectors(graph, cands, signals.embedder, cfg.result_clip_chars, [x, f])
        q = cfg.task_weight * xf[0] + cfg.latest_weight * xf[1]
        qn = float(np.linalg.norm(q)) or 1.0
        deps = dependency_results(graph, cfg.dep_ancestors) if cfg.w_dep else set()
        age, c, s, score = scores(graph, cands, V, q, qn, deps, cfg)
        sel = layout.selection()
        selected = greedy_select(cands, None, sel, None, cfg.similarity_penalty, arrays=(score, V))
        assert budget is not None  # with None the history always fits (above)
        left = budget - sel.used
        # fill reaches the selection weakly and the layout not at all: the layout keeps fill until its
        # reasons are read, and a strong reference back made every render a cycle for the collector
        # (the rendering's reasons builder keeps the selection alive meanwhile)
        form, sel_ref = layout.form, weakref.ref(sel)

        def fill(reasons: dict[int, str]) -> None:  # eq. 2's terms, per candidate, when someone reads them
            a_, c_, s_, u_ = age.tolist(), c.tolist(), s.tolist(), score.tolist()
            at = {p: i for i, p in enumerate(cands)}

            def part(p: int) -> str:
                i = at[p]
                dep = f", ancestor +{cfg.w_dep:g}" if p in deps else ""
                return f"U={u_[i]:.3f} (age={a_[i]}, reuse c={c_[i]:.2f}, relevance s={s_[i]:.3f}{dep})"
            chosen = set(selected)
            for rank, p in enumerate(selected, 1):
                kind = "excerpt of oversized result" if form[p] is not msgs[p] else "selected"
                reasons[p] = f"{kind} #{rank}: {part(p)}"
            live = sel_ref()
            assert live is not None, "a rendering's reasons builder keeps its selection"
            final = dict(zip(cands, live.candidate_costs().tolist()))
            for p in cands:
                if p not in chosen:
                    reasons[p] = (f"omitted: {part(p)}; not selected within B (showing it would add {final[p]} "
                                  f"tokens, {left} of B unused when selection ended)")
        layout.defer_reasons(fill)
        return layout.assemble(self.name, sel)


_RECENCY: dict[float, np.ndarray] = {}  # λ -> [exp(−λ·a) for a = 0, 1, …]


def scores(graph: ContextGraph, cands: list[int], V: np.ndarray, q: np.ndarray, qn: float, deps: set[int],
           cfg: ContextRenderConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(age, c, s, U')`` of every candidate (eq. 2, eq. 1, eq. 5 and the dependency term), as
    arrays, each value bit for bit what :func:`usefulness` and ``max(float(v @ q) / qn, 0.0)``
    give one candidate at a time: ``e^{−λa}`` from a table of ``math.exp`` per age, the reuse term
    computed for the results with observed reuse only (it is 0 for the others), the cosines by
    ``np.vecdot`` (the per-pair dot product of ``v @ q``, not a matrix product, whose rounding
    differs). ``V`` holds one row per candidate."""
    n = len(cands)
    turn_of = graph.turn_of
    age = graph.turns - np.fromiter(map(turn_of.__getitem__, cands), dtype=np.int64, count=n)
    table = _RECENCY.get(cfg.lam)
    top = int(age.max()) + 1 if n else 0
    if table is None or len(table) < top:
        size = max(top, 2 * len(table) if table is not None else 64)
        table = _RECENCY[cfg.lam] = np.array([math.exp(-cfg.lam * a) for a in range(size)])
    rec = table[age]
    c = np.zeros(n)
    reuse_exp = np.ones(n)  # e^{−γ·0} = 1 for results never reused
    cand = np.asarray(cands, dtype=np.int64)
    matched = np.fromiter(graph.reuse.matches.keys(), dtype=np.int64)
    at = np.searchsorted(cand, matched)
    hits = [(i, p) for i, p in zip(at.tolist(), matched.tolist()) if i < n and cands[i] == p]
    if hits:
        at_hit = [i for i, _ in hits]
        cs = graph.reuse_scores([p for _, p in hits])
        c[at_hit] = cs
        reuse_exp[at_hit] = [math.exp(-cfg.gamma * ci) for ci in cs]
    cos = np.vecdot(V, q).astype(np.float64) / qn if n else np.zeros(0)
    s = np.where(cos < 0.0, 0.0, cos)  # max(cos, 0.0)
    u = cfg.w_rec * rec + cfg.w_reuse * (1.0 - reuse_exp) + cfg.w_rel * s
    if deps:
        u = u + np.where(np.isin(cand, list(deps)), cfg.w_dep, 0.0)
    return age, c, s, u


class _VectorCache:
    """The memo rows (:meth:`CachedEmbedder.rows`) of one graph's results (their first ``clip``
    characters) in one embedder, by position: results never change, so each is asked for once,
    and their vectors are one ``np.take`` of the embedder's memo."""

    def __init__(self, embedder: CachedEmbedder) -> None:
        self.lock = threading.Lock()
        self.reset(embedder)

    def reset(self, embedder: CachedEmbedder) -> None:
        """Empty, for ``embedder`` (as new)."""
        self.embedder = weakref.ref(embedder)
        self.have = np.zeros(0, dtype=bool)
        self.row = np.zeros(0, dtype=np.int64)  # position -> its memo row (where ``have``)
        # the vectors of the positions ``seq_pos[:seq_n]`` (ascending), one after the other: a
        # request for a prefix of them is answered by a view (see result_vectors's ``ordered``)
        self.seq_pos = np.zeros(0, dtype=np.int64)
        self.seq_rows = np.zeros((0, embedder.dim), dtype=np.float32)
        self.seq_n = 0

    def ordered(self, cand: np.ndarray, embedder: CachedEmbedder) -> np.ndarray:
        """The vectors of ascending positions ``cand`` that all have rows, as a read-only
        C-contiguous view of ``seq_rows``: ``seq_pos`` is cut at the first position where it and
        ``cand`` differ and extended by the rest of ``cand``. A cut copies the table first, and
        growing allocates a new one, so a view handed out earlier keeps its values."""
        n, m = self.seq_n, len(cand)
        k = min(n, m)
        same = self.seq_pos[:k] == cand[:k]
        j = k if same.all() else int(same.argmin())  # the first position where they differ
        if j < n and m > j:  # cut (a copy: earlier views keep what they hold)
            self.seq_pos, self.seq_rows = self.seq_pos[:j].copy(), self.seq_rows[:j].copy()
            n = self.seq_n = j
        if m > n:
            vecs = embedder.vectors(self.row[cand[n:]])
            if m > len(self.seq_pos):
                size = max(m, 2 * len(self.seq_pos), 64)
                pos = np.zeros(size, dtype=np.int64)
                rows = np.empty((size, vecs.shape[1]), dtype=np.float32)
                pos[:n], rows[:n] = self.seq_pos[:n], self.seq_rows[:n]
                self.seq_pos, self.seq_rows = pos, rows
            self.seq_pos[n:m] = cand[n:]
            self.seq_rows[n:m] = vecs
            self.seq_n = m
        view = self.seq_rows[:m]
        view.flags.writeable = False
        return view


_VECTORS = "contextrender.vectors"  # graph.memo key, with id(embedder) and clip


def result_vectors(graph: ContextGraph, cands: list[int], embedder: CachedEmbedder, clip: int,
                   extra: list[str], out: np.ndarray | None = None,
                   ordered: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(rows of the candidates' vectors, vectors of the extra texts)``, the values one
    ``embedder.embed([results clipped…] + extra)`` returns (float32, ``(len(cands), dim)`` and
    ``(len(extra), dim)``). The memo rows of results asked for before for this graph come from a
    per-graph table; the rest and ``extra`` are asked for in one call, in the same order, so the
    embedder sees the same new texts in the same batch. While the embedder logs every text asked
    for (the evaluator counts them) it is asked for all of them. ``out``: an array of the rows'
    shape to write them to (and return). ``ordered`` (``cands`` ascending): the rows are a
    read-only C-contiguous view of a per-graph table kept in position order
    (:meth:`_VectorCache.ordered`), not copied when ``cands`` extends the previous request; while
    the embedder logs, the rows as without it."""
    msgs = graph.messages
    if not isinstance(embedder, CachedEmbedder) or embedder.log is not None:
        vecs = embedder.embed([msgs[p].content[:clip] for p in cands] + extra)
        if out is not None:
            out[:] = vecs[:len(cands)]
            return out, vecs[len(cands):]
        return vecs[:len(cands)], vecs[len(cands):]
    cache = graph.memo((_VECTORS, id(embedder), clip), lambda: _VectorCache(embedder))
    with cache.lock:
        if cache.embedder() is not embedder:  # made for an earlier embedder, gone, whose id this one has
            cache.reset(embedder)
        cand = np.asarray(cands, dtype=np.int64)
        if len(cache.have) < len(msgs):
            size = max(len(msgs), 2 * len(cache.have))
            have = np.zeros(size, dtype=bool)
            have[:len(cache.have)] = cache.have
            row = np.zeros(size, dtype=np.int64)
            row[:len(cache.row)] = cache.row
            cache.have, cache.row = have, row
        new = cand[~cache.have[cand]]
        rows, extra_rows = _result_rows(graph, embedder, clip, new.tolist(), extra)
        cache.row[new] = rows
        cache.have[new] = True
        extra_vecs = embedder.vectors(extra_rows)
        if ordered:
            return cache.ordered(cand, embedder), extra_vecs
        return embedder.vectors(cache.row[cand], out=out), extra_vecs


@functools.cache
def result_keys(model: str, clip: int) -> DerivedKind:
    """The derived rows (:mod:`historygraph.history.derived`) of the results' embedding-cache keys: at a
    result's position, :func:`~historygraph.signals.embeddings.content_key` of its first ``clip``
    characters under ``model`` (both in the kind's name, so a row is used only for the text it
    was made from: a stored position's message never changes). A reopened session's first render
    then finds its vectors in the embedder's memo without hashing the result texts again."""
    return DerivedKind(f"embedding.keys:{model}:{clip}", ("historygraph.signals.embeddings", "historygraph.policies.contextrender"))


def _result_rows(graph: ContextGraph, embedder: CachedEmbedder, clip: int, positions: list[int],
                 extra: list[str]) -> tuple[list[int], list[int]]:
    """The memo rows of ``embedder.hold([results at positions, clipped…] + extra)``, split into
    the results' and the extra texts'. The results' keys come from their stored rows
    (:func:`result_keys`); when the memo holds all of them, the result texts are not read at all
    and only ``extra`` is held (the same texts reach the model, in the same order, as in the one
    call). Keys computed here are put for the store to write."""
    kind = result_keys(embedder.model, clip)
    stored = graph.derived.table(kind)
    got: list[str | None] | None = list(map(stored.pop, positions, itertools.repeat(None))) if stored and positions else None
    if got is not None and None not in got and (rows := embedder.rows(cast(list[str], got))) is not None:
        return rows, embedder.hold(extra)
    texts = [graph.messages[p].content[:clip] for p in positions]
    if got is None and not (positions and graph.derived.persist):
        rows = embedder.hold(texts + extra)
    else:
        keys = embedder.keys(texts) if got is None else [k if k is not None else embedder.key(t) for k, t in zip(got, texts)]
        for i, p in enumerate(positions):
            if got is None or got[i] is None:
                graph.derived.put(kind, p, keys[i])
        rows = embedder.hold(texts + extra, keys + embedder.keys(extra))
    return rows[:len(positions)], rows[len(positions):]


register("contextrender", SOURCE, "Usefulness = recency + observed reuse (TFA) + relevance; greedy under B with a similarity penalty.")(ContextRender)

# Selector ablations of ContextRender §4.4 / B.3 (Table 3): omitted terms get weight 0, the
# retained weights, λ, γ, the similarity penalty and the accounting stay unchanged.
register("cr-recency", "ContextRender §4.4, B.3 (CR–Recency)", "ContextRender with only the recency term.",
         w_reuse=0.0, w_rel=0.0)(ContextRender)
register("cr-relevance", "ContextRender §4.4, B.3 (CR–Relevance)", "ContextRender with only the relevance term.",
         w_rec=0.0, w_reuse=0.0)(ContextRender)
register("cr-recency-relevance", "ContextRender §4.4, B.3 (CR–Recency + Relevance)",
         "ContextRender without observed reuse.", w_reuse=0.0)(ContextRender)

# Ours, beyond the papers: eq. 2 plus a dependency term from ContextWeaver (§3.1, §3.3). The
# values (w_dep = 0.5, W = 10) come from 11 settings tried (w_dep 0.25–1.0, W 3–20) on the 20
# mini-swe-agent and OpenHands trajectories at B = 6000 and 4000 that the README reports, so they
# are fitted to those traces; recall varies by at most 1.2 points over w_dep 0.5–0.75, W 10–20.
register("contextrender-dep", "ours: ContextRender eq. 2 + ContextWeaver §3.1 ancestry",
         "ContextRender with +0.5 usefulness for results of the current step's dependency ancestry (W=10).",
         w_dep=0.5, dep_ancestors=10)(ContextRender)

# Ours, beyond the papers: the same selection under the result-reserve layout of ``learned``
# (result_reserve 0.95, brief revivals; chosen on the training trajectories, see the module docstring).
register("contextrender-reserve", "ours: ContextRender eq. 2 under the result-reserve layout",
         "ContextRender's selection; non-tool history kept within 5 % of B, a step brought back for its result "
         "shown in brief.", result_reserve=0.95, brief_revivals=True)(ContextRender)
