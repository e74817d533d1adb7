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
   the TFA reuse score of eq. 1 (:mod:`historygraph.signals.reuse`).
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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..graph import ContextGraph
from ..render import Layout, Rendering, Selection
from ..signals.steps import ancestry, lowcost_steps
from .base import Signals, register

SOURCE = "ContextRender §3.3, A.1–A.4"


@dataclass(frozen=True)
class ContextRenderConfig:
    """Parameters of eq. 2, eq. 4 and eq. 7; defaults from ContextRender A.3 and A.4."""

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

    def __post_init__(self) -> None:
        for name in ("w_rec", "w_reuse", "w_rel", "lam", "gamma", "similarity_penalty", "w_dep", "dep_ancestors"):
            if getattr(self, name) < 0:
                raise ValueError(f"ContextRender config: {name} must be ≥ 0, got {getattr(self, name)}")
        if not 0 < self.oversized_excerpt_fraction <= 1:
            raise ValueError("ContextRender config: oversized_excerpt_fraction must be in (0, 1]")


def usefulness(age: int, reuse: float, relevance: float, cfg: ContextRenderConfig) -> float:
    """Eq. 2 of ContextRender: ``W_rec e^{−λa} + W_reuse (1 − e^{−γc}) + W_rel s``."""
    return (cfg.w_rec * math.exp(-cfg.lam * age) + cfg.w_reuse * (1.0 - math.exp(-cfg.gamma * reuse))
            + cfg.w_rel * relevance)


def query_texts(graph: ContextGraph, cfg: ContextRenderConfig) -> tuple[str, str]:
    """``(x, f_t)`` of eq. 4: first user message (clipped) and latest user + assistant messages."""
    users = [m for m in graph.messages if m.role == "user"]
    assistants = [m for m in graph.messages if m.role == "assistant"]
    x = users[0].content[:cfg.task_clip_chars] if users else ""
    latest = []
    if users:
        latest.append(users[-1].content)
    if assistants:
        a = assistants[-1]
        latest.append("\n".join([a.content] + [f"{c.name} {c.arguments}" for c in a.tool_calls]))
    return x, "\n".join(latest)[:cfg.result_clip_chars]


def greedy_select(candidates: list[int], score: dict[int, float], sel: Selection, vectors: dict[int, np.ndarray],
                  penalty: float) -> list[int]:
    """Algorithm 1 lines 15–20 with eq. 6–7; fills ``sel`` and returns positions in selection order.

    Each pick takes, among the remaining candidates that fit, the highest ``R = U − penalty·D``;
    candidates are in transcript order and ``argmax`` returns the first maximum, which is the
    loop's strictly-higher replacement (exact ties go to the older result). Vectorised: costs,
    ``R`` and ``D(r, S)`` are arrays; after a pick only the costs of the picked result's own step
    can change (the step is revived), so only those are recomputed.
    """
    n = len(candidates)
    if not n:
        return []
    lay = sel.layout
    budget = lay.budget
    cand = np.asarray(candidates)
    s = np.fromiter((score[p] for p in candidates), dtype=np.float64, count=n)
    V = np.stack([vectors[p] for p in candidates])
    cost = sel.candidate_costs() if candidates == lay.candidates else \
        np.fromiter((sel.cost(p) for p in candidates), dtype=np.int64, count=n)
    unit = np.fromiter((lay.unit_of[p] for p in candidates), dtype=np.int64, count=n)
    sim = np.zeros(n)  # D(r, S), floored at 0
    left = np.ones(n, dtype=bool)
    selected: list[int] = []
    while True:
        ok = left if budget is None else left & (cost <= budget - sel.used)
        if not ok.any():
            return selected
        r = np.where(ok, s - penalty * sim, -np.inf)
        i = int(np.argmax(r))
        best = int(cand[i])
        selected.append(best)
        left[i] = False
        revives = int(unit[i]) in lay.dropped_units and int(unit[i]) not in sel.revived
        sel.take(best)
        if revives:  # its other results no longer pay for the step, and the markers around it change
            if candidates == lay.candidates:
                cost = sel.candidate_costs()
            else:
                for j in np.flatnonzero(left & np.isin(unit, list(lay.dropped_units))):
                    cost[j] = sel.cost(int(cand[j]))
        # row by row with one kernel (einsum, not BLAS gemv, whose rounding depends on the row's
        # place in a block): identical results get identical similarities, so exact ties stay ties
        np.maximum(sim, np.einsum("ij,j->i", V, V[i]).astype(np.float64), out=sim)


def dependency_results(graph: ContextGraph, max_ancestors: int) -> set[int]:
    """Positions of the tool results of the current step's ancestors: ContextWeaver's low-cost
    parents (§3.3) and breadth-first ancestry bounded by ``max_ancestors`` (§3.1); ours to combine
    them with eq. 2 (see :func:`historygraph.signals.steps.ancestry`)."""
    steps = lowcost_steps(graph)
    if not steps:
        return set()
    return {p for i in ancestry(steps, len(steps) - 1, max_ancestors) for p in steps[i].results}


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
        layout = Layout(graph, signals.counter, budget, excerpt_fraction=cfg.oversized_excerpt_fraction)
        msgs = graph.messages
        if layout.fits_in_full:
            return layout.assemble_full(self.name)
        cands = layout.candidates
        x, f = query_texts(graph, cfg)
        vecs = signals.embedder.embed([msgs[p].content[:cfg.result_clip_chars] for p in cands] + [x, f])
        q = cfg.task_weight * vecs[-2] + cfg.latest_weight * vecs[-1]
        qn = float(np.linalg.norm(q)) or 1.0
        vectors = {p: vecs[i] for i, p in enumerate(cands)}
        deps = dependency_results(graph, cfg.dep_ancestors) if cfg.w_dep else set()
        score, parts = {}, {}
        for p in cands:
            a, c = graph.age(p), graph.reuse_score(p)
            s = max(float(vectors[p] @ q) / qn, 0.0)
            score[p] = usefulness(a, c, s, cfg) + (cfg.w_dep if p in deps else 0.0)
            dep = f", ancestor +{cfg.w_dep:g}" if p in deps else ""
            parts[p] = f"U={score[p]:.3f} (age={a}, reuse c={c:.2f}, relevance s={s:.3f}{dep})"
        sel = layout.selection()
        selected = greedy_select(cands, score, sel, vectors, cfg.similarity_penalty)
        chosen = set(selected)
        for rank, p in enumerate(selected, 1):
            kind = "excerpt of oversized result" if layout.form[p] is not msgs[p] else "selected"
            layout.reasons[p] = f"{kind} #{rank}: {parts[p]}"
        left = budget - sel.used  # budget is set here: with None the history always fits (above)
        final = dict(zip(cands, sel.candidate_costs().tolist()))
        for p in cands:
            if p not in chosen:
                layout.reasons[p] = (f"omitted: {parts[p]}; not selected within B (showing it costs {final[p]} "
                                     f"tokens, {left} were left when selection ended)")
        return layout.assemble(self.name, sel)


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
