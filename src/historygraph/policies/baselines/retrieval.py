"""Retrieval baselines: embedding similarity (ContextRender B.2) and BM25 (ContextWeaver §4).

``semantic`` (ContextRender B.2, "Semantic Retrieval"):

1. Results of the ``recent_turns = 3`` most recent turns (age 0, 1, 2 in model invocations, as in
   ContextRender §3.3) are considered first, newest first; each is kept when the tokens it adds
   keep the recent results' total within ``recent_share = 0.6`` of B and the history within B.
2. The other results are ranked by cosine similarity between their embedding (first
   ``clip_chars = 8000`` characters, as ContextRender A.3 clips results) and the embedding of the
   latest user message followed by the latest assistant message (the retrieval input of B.2);
   each is kept, best first, when it fits in what is left of B. Exact ties go to the older result.

``cw-bm25`` (ContextWeaver §4, "Baselines", retrieval): ``n_full = 6`` observations in full, of
which ``n_retrieved = 3`` are the older observations that BM25 (the ``bm25s`` library, English
stop words removed, default k1 = 1.5, b = 0.75) scores highest for the current step, and the other
three are the most recent observations. The current step is the latest assistant message (its text
and tool calls) together with its results. Older observations that share no term with the step
(score 0) are never retrieved, so fewer than three may be added; exact ties go to the newer one.

Shared rules (:class:`~historygraph.render.Layout`): a history that fits in B is returned
unchanged; unselected results are placeholders naming their ids and stay retrievable.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import msgspec
import numpy as np

from historygraph.history.derived import DerivedKind, pack_array, snapshot_due, unpack_array
from historygraph.history.graph import ContextGraph
from historygraph.render import Layout, Rendering, Selection
from historygraph.policies.base import Signals
from historygraph.policies.registry import register
from historygraph.policies.contextrender import result_vectors


def latest_query(graph: ContextGraph, clip_chars: int, at: tuple[int | None, int | None] | None = None) -> str:
    """The latest user message followed by the latest assistant message (text and tool calls);
    ``at``: their positions (``None`` for none) when the caller has them (a layout's
    ``current_user`` and ``last_assistant``), found by a scan otherwise."""
    parts = []
    for k, role in enumerate(("user", "assistant")):
        if at is None:
            m = next((m for m in reversed(graph.messages) if m.role == role), None)
        else:
            pos = at[k]
            m = graph.messages[pos] if pos is not None else None
        if m is not None:
            parts.append("\n".join([m.content] + [f"{c.name} {c.arguments}" for c in m.tool_calls]))
    return "\n".join(parts)[:clip_chars]


@dataclass(frozen=True)
class SemanticConfig:
    """Defaults from ContextRender B.2 (3 turns, 60 % of B) and A.3 (8,000-character clipping)."""

    recent_turns: int = 3
    recent_share: float = 0.6
    clip_chars: int = 8000

    def __post_init__(self) -> None:
        if self.recent_turns < 0 or not 0 <= self.recent_share <= 1 or self.clip_chars < 1:
            raise ValueError("semantic config: recent_turns ≥ 0, 0 ≤ recent_share ≤ 1 and clip_chars ≥ 1 are required")


@register("semantic", "ContextRender B.2 (Semantic Retrieval)",
          "Results of the 3 latest turns first (≤ 60% of B), then the rest by embedding similarity to the latest messages.")
class SemanticRetrieval:
    """ContextRender's Semantic Retrieval baseline (B.2); see the module docstring."""

    Config = SemanticConfig

    def __init__(self, name: str = "semantic", config: SemanticConfig | None = None) -> None:
        self.name, self.config = name, config or SemanticConfig()

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        cfg = self.config
        layout = Layout(graph, signals.counter, budget)
        if layout.fits_in_full:
            return layout.assemble_full(self.name)
        sel = layout.selection()
        cands = layout.candidates
        turn_of = graph.turn_of
        ages = graph.turns - np.fromiter(map(turn_of.__getitem__, cands), dtype=np.int64, count=len(cands))
        recent = [cands[i] for i in np.flatnonzero(ages < cfg.recent_turns)[::-1].tolist()]  # newest first
        assert budget is not None  # (no budget: the history fits)
        recent_cap, recent_used = cfg.recent_share * budget, 0
        for p in recent:
            if sel.fits(p) and recent_used + sel.cost(p) <= recent_cap:
                recent_used += sel.cost(p)
                sel.take(p)
                layout.reasons[p] = f"kept: result of the {cfg.recent_turns} most recent turns (age {graph.age(p)})"
            else:
                layout.reasons[p] = f"omitted: recent, but over {cfg.recent_share:.0%} of B or B"
        recent_set = set(recent)
        rest = [p for p in layout.candidates if p not in recent_set]
        if rest:
            # the rows of what embed([results clipped…] + [query]) returns: a C-contiguous
            # (n, dim) float32 array, as embed's own, from the per-graph table kept in position
            # order (rest, the older candidates, mostly extends the previous render's); the
            # product is the BLAS library's single-thread one (single_thread_product)
            rows, q = result_vectors(graph, rest, signals.embedder, cfg.clip_chars,
                                     [latest_query(graph, cfg.clip_chars, (layout.current_user, layout.last_assistant))],
                                     ordered=True)
            sims = single_thread_product(rows, np.array(q[0], dtype=np.float32))
            order = np.argsort(-sims, kind="stable")
            taken = take_in_order(layout, sel, [rest[i] for i in order.tolist()])

            def fill(reasons: dict[int, str]) -> None:  # in the order the loop decided them
                for i, ok in zip(order.tolist(), taken):
                    reasons[rest[i]] = (f"kept: cosine {sims[i]:.3f} to the latest messages" if ok else
                                        f"omitted: cosine {sims[i]:.3f}; does not fit in B")
            layout.defer_reasons(fill)
        return layout.assemble(self.name, sel)


def single_thread_product(rows: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``rows @ q`` (float32 ``(n, dim)`` by ``(dim,)``) as the BLAS library computes it on one
    thread, without its threads: in pieces of :func:`_piece_rows` rows (a multiple of 4, the last
    piece 4 to ``piece + 3`` rows), each under OpenBLAS's smallest threading threshold.

    Why: OpenBLAS (numpy's BLAS) runs ``sgemv`` on several threads once ``n · dim`` reaches its
    threshold (1,200 rows at 384 dimensions with numpy's OpenBLAS 0.3.31), and the second thread's
    spin after the call is CPU time of the render (≈ 4 of a semantic render's 8 ms at 5,000
    results, bench/RESULTS.md); each output's last bits also depend on where the threads split
    the rows, so on the thread count of the machine. A single-thread product is unchanged when
    cut at a multiple of 4 rows from its start (the kernel takes 4 outputs at a time, the rest one
    by one), except that a one-row piece goes through another path (numpy's dot), hence no
    one-row piece. The rule is the library's, not ours: it is checked once per process on random
    data against the whole product at sizes the library computes on one thread
    (:func:`_pieces_match`), and where it does not hold the whole product is used as before."""
    if len(rows) <= _piece_rows(rows.shape[1]) + 3 or not _pieces_ok(rows.shape[1]):
        return rows @ q
    return _by_pieces(rows, q)


def _by_pieces(rows: np.ndarray, q: np.ndarray) -> np.ndarray:
    n, piece = len(rows), _piece_rows(rows.shape[1])
    cuts = list(range(0, n, piece))
    if len(cuts) > 1 and n - cuts[-1] < 4:  # the last piece: 4 rows or more (a one-row piece rounds otherwise)
        cuts.pop()
    cuts.append(n)
    out = np.empty(n, dtype=np.result_type(rows, q))
    for a, b in zip(cuts, cuts[1:]):
        np.matmul(rows[a:b], q, out=out[a:b])
    return out


def _piece_rows(dim: int) -> int:
    """Rows per piece of :func:`single_thread_product`: a multiple of 4 with ``rows · dim`` ≤
    98,304, below OpenBLAS's smallest threading threshold for ``gemv`` (``m · n`` ≥ 115,200 ×
    ``GEMM_MULTITHREAD_THRESHOLD``, a build setting ≥ 1, 4 by default: interface/gemv.c);
    256 rows at 384 dimensions."""
    return max(4, 98_304 // max(1, dim) // 4 * 4)


_PIECES_OK: dict[int, bool] = {}  # per dimension: whether single_thread_product's pieces give the whole product's bits
_PIECES_LOCK = threading.Lock()


def _pieces_ok(dim: int) -> bool:
    ok = _PIECES_OK.get(dim)
    if ok is None:
        with _PIECES_LOCK:
            ok = _PIECES_OK.get(dim)
            if ok is None:
                ok = _PIECES_OK[dim] = _pieces_match(dim)
    return ok


def _pieces_match(dim: int) -> bool:
    """Whether the pieces of :func:`single_thread_product` give the bits of the whole product,
    on random float32 data (a fixed seed) at sizes whose whole product the library computes on
    one thread (below 3 pieces and 4 rows at ``dim``: ≤ 295,000 ``n · dim``, under OpenBLAS's
    default threshold of 460,800), including every kind of last piece (2–7 rows past a cut)."""
    piece = _piece_rows(dim)
    rng = np.random.default_rng(20261202)
    rows = rng.random((3 * piece + 8, dim), dtype=np.float32) - np.float32(0.5)
    q = rng.random(dim, dtype=np.float32) - np.float32(0.5)
    for n in (piece + 4, piece + 5, piece + 6, piece + 7, 2 * piece + 1, 2 * piece + 2, 2 * piece + 3,
              3 * piece, 3 * piece + 1, 3 * piece + 7):
        if _by_pieces(rows[:n], q).tobytes() != (rows[:n] @ q).tobytes():
            return False
    return True


def take_in_order(layout: Layout, sel: Selection, order: list[int]) -> list[bool]:
    """``for p in order: take p if it fits`` (each in its default form); returns whether each was
    taken. Lower bounds of every candidate's cost (:meth:`~historygraph.render.Selection.lower_costs`,
    exact but for results of dropped steps not revived) skip at once those that cannot fit what is
    left; the others are priced exactly, and after ``_EXACT_AFTER`` of them every candidate is
    priced at once (:meth:`~historygraph.render.Selection.candidate_costs`); a revival changes
    costs, so the bounds are taken again. ``order`` holds candidates of ``layout``."""
    taken = [False] * len(order)
    for k in taken_in_order(layout, sel, order):
        taken[k] = True
    return taken


def taken_in_order(layout: Layout, sel: Selection, order: list[int], idx: np.ndarray | None = None) -> list[int]:
    """:func:`take_in_order`, returning the indices into ``order`` of the results taken, ascending;
    ``idx``: the index of each of ``order`` in ``layout.candidates`` when the caller has it."""
    if idx is None:
        idx = np.searchsorted(np.asarray(layout.candidates, dtype=np.int64), np.asarray(order, dtype=np.int64))
    low, exact, asked = sel.lower_costs()[idx], False, 0
    out: list[int] = []
    dropped, units = layout.dropped_units, layout.candidate_units()
    assert layout.budget is not None
    room = layout.budget - sel.used
    # the next ones whose bound fits what was left (nonzero, the method: np.flatnonzero's wrappers cost more than the work)
    ahead, at = (low <= room).nonzero()[0], 0
    while at < len(ahead):
        k = int(ahead[at])
        if low[k] > room:  # what is left shrank since: find the next ones that fit it
            ahead, at = (low[k:] <= room).nonzero()[0] + k, 0
            continue
        at += 1
        p = order[k]
        i = int(idx[k])
        u = int(units[i])
        revives = u in dropped and u not in sel.revived
        if revives and not exact:  # only a dropped step's bound is not its cost
            asked += 1
            if asked > _EXACT_AFTER:
                low, exact = sel.candidate_costs()[idx], True
        cost = int(low[k]) if exact or not revives else sel.exact_cost(p, index=i)
        if cost <= room:
            sel.take(p, cost=cost, index=i, unit=u)
            out.append(k)
            room = layout.budget - sel.used
            if revives:  # costs changed
                low, exact, asked = sel.lower_costs()[idx], False, 0
            if revives or cost < 0:  # (a result shorter than its placeholder leaves more room)
                ahead, at = (low[k + 1:] <= room).nonzero()[0] + (k + 1), 0
    return out


_EXACT_AFTER = 32  # exact prices asked between revivals before every candidate is priced at once


def current_step(graph: ContextGraph) -> str:
    """The latest assistant message (text, tool-call names and arguments) and its results' text."""
    msgs = graph.messages
    step = next((p for p in range(len(msgs) - 1, -1, -1) if msgs[p].role == "assistant"), None)
    if step is None:
        return ""
    a = msgs[step]
    parts = [a.content] + [f"{c.name} {c.arguments}" for c in a.tool_calls]
    parts += [msgs[graph.result_of[c.id]].content for c in a.tool_calls if c.id in graph.result_of]
    return "\n".join(parts)


@dataclass(frozen=True)
class BM25Config:
    """Defaults from ContextWeaver §4: 6 observations in full, 3 of them retrieved by BM25."""

    n_full: int = 6
    n_retrieved: int = 3

    def __post_init__(self) -> None:
        if not 0 <= self.n_retrieved <= self.n_full:
            raise ValueError("bm25 config: 0 ≤ n_retrieved ≤ n_full is required")


def bm25_scores(corpus: list[str], query: str) -> np.ndarray:
    """BM25 score of every text of ``corpus`` for ``query`` (``bm25s``, English stop words removed)."""
    import bm25s

    tokens = bm25s.tokenize(corpus, stopwords="en", show_progress=False, return_ids=False)
    q = bm25s.tokenize([query], stopwords="en", show_progress=False, return_ids=False)[0]
    if not q or not any(tokens):
        return np.zeros(len(corpus))
    retriever = bm25s.BM25()
    retriever.index(tokens, show_progress=False)
    return np.asarray(retriever.get_scores(q), dtype=float)


BM25_TOKENS = DerivedKind("bm25.tokens", ("historygraph.policies.baselines.retrieval", "bm25s.tokenization", "bm25s.stopwords"))
"""Derived rows of each tool result's BM25 tokens (:func:`_bm25_tokens`): ``[term frequencies in
order of first occurrence, number of tokens]``, kept with a stored session
(:mod:`historygraph.history.derived`) so a reopened session's index does not tokenise its history again."""


def _bm25_tokens(texts: list[str]) -> list[list[str]]:
    import bm25s

    return bm25s.tokenize(texts, stopwords="en", show_progress=False, return_ids=False)


BM25_SNAPSHOT = DerivedKind("bm25.index", BM25_TOKENS.modules + ("historygraph.history.derived",))  # its arrays: derived.pack_array
"""A derived row (position 0) holding a :class:`BM25Index`'s corpus, lengths and postings
(:meth:`BM25Index._pack`), rewritten when the session has grown by a quarter (as the step view's
snapshot, :data:`historygraph.history.derived.SNAPSHOT_GROWTH`), so that a reopened session's first
render starts from it instead of adding every older result's terms."""


class BM25Index:
    """An incremental BM25 index over the tool results of one graph, scoring as :func:`bm25_scores`
    does, bit for bit, without re-tokenising or rebuilding per render.

    Each result is tokenised once (``bm25s`` tokenizer, English stop words) when it first enters
    the corpus, or its tokens are read from the session's stored rows (:data:`BM25_TOKENS`); document frequencies, lengths and postings are kept for the current corpus and
    updated by difference when the corpus changes (for ``cw-bm25`` it only grows: the older
    observations). Scores follow ``bm25s``'s defaults (Lucene variant, k1 = 1.5, b = 0.75):
    ``idf(t) = ln(1 + (N − df + 0.5)/(df + 0.5))`` stored as float32; per document
    ``float32(idf · tf/(k1·(1 − b + b·|d|/avgdl) + tf))``; summed in float32 over the query's
    tokens in order, repeats included, terms absent from the corpus skipped. Cost per render:
    O(new results) to index and O(postings of the query's terms) to score. A graph from a store
    starts from the session's :data:`BM25_SNAPSHOT` when it has one: a term's postings are
    unpacked when first used, a member's term frequencies read (or tokenised again) only if it
    leaves the corpus.
    """

    K1, B = 1.5, 0.75

    def __init__(self) -> None:
        self.tokens: dict[int, tuple[dict[str, int], int]] = {}  # position -> (term frequencies, length)
        self.lengths: dict[int, int] = {}  # position -> length, of every result tokenised or restored
        self.members: set[int] = set()
        # term -> {position: tf} over the members (its length is the term's document frequency)
        self.postings: dict[str, dict[int, int]] = {}
        self.packed: dict[str, int] = {}  # term -> its slot in the restored arrays, until unpacked
        self._packed_arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # indptr, positions, tfs
        self.total_length = 0
        self.kept = 0  # messages of the last snapshot read or put
        self.lock = threading.Lock()

    def _posting(self, t: str) -> dict[int, int] | None:
        post = self.postings.get(t)
        if post is None and t in self.packed:
            indptr, pos, tf = self._packed_arrays  # type: ignore[misc]
            i = self.packed.pop(t)
            a, b = int(indptr[i]), int(indptr[i + 1])
            post = self.postings[t] = dict(zip(pos[a:b].tolist(), tf[a:b].tolist()))
        return post

    def _tf(self, graph: ContextGraph, p: int) -> dict[str, int]:
        got = self.tokens.get(p)
        if got is None:
            self._tokenise(graph, [p])
            got = self.tokens[p]
        return got[0]

    def _tokenise(self, graph: ContextGraph, positions: list[int]) -> None:
        take = graph.derived.take_value
        new = []
        for p in positions:
            if p not in self.tokens:
                row = take(BM25_TOKENS, p)
                if row is not None:
                    self.tokens[p] = (row[0], row[1])
                    self.lengths[p] = row[1]
                else:
                    new.append(p)
        if new:
            for p, toks in zip(new, _bm25_tokens([graph.messages[p].content for p in new])):
                tf: dict[str, int] = {}
                for t in toks:
                    tf[t] = tf.get(t, 0) + 1
                self.tokens[p] = (tf, len(toks))
                self.lengths[p] = len(toks)
                if p not in self.members:  # (a member's tokens again, for it to leave: stored already)
                    graph.derived.put(BM25_TOKENS, p, [tf, len(toks)])

    def _set_corpus(self, graph: ContextGraph, corpus: list[int]) -> None:
        want = set(corpus)
        gone, added = self.members - want, [p for p in corpus if p not in self.members]
        if len(added) > 64 and not self.members and not self.tokens:
            graph.derived.table(BM25_TOKENS)  # a whole corpus (no snapshot): every row decoded at once
        self._tokenise(graph, added)
        postings, tokens = self.postings, self.tokens
        for p in gone:
            tf = self._tf(graph, p)
            self.total_length -= self.lengths[p]
            for t in tf:
                del self._posting(t)[p]  # type: ignore[union-attr]
        for p in added:  # (a reopened session's first render without a snapshot adds every older result here)
            tf, n = tokens[p]
            self.total_length += n
            for t, c in tf.items():
                post = postings.get(t)
                if post is None:
                    post = self._posting(t)
                if post is None:
                    postings[t] = {p: c}
                else:
                    post[p] = c
        self.members = want

    def _pack(self, upto: int) -> dict:
        """The members, their lengths and every term's postings (flat arrays as base64 bytes)."""
        members = sorted(self.members)
        terms: list[str] = []
        indptr: list[int] = [0]
        pos: list[int] = []  # the members holding each term, term after term
        tf: list[int] = []  # their counts of it
        for t in list(self.postings) + list(self.packed):
            post = self._posting(t)
            if post:
                terms.append(t)
                pos.extend(post)
                tf.extend(post.values())
                indptr.append(len(pos))
        wide = max(indptr[-1], max(pos, default=0), max(tf, default=0)) >= 2**31
        dtype = np.dtype(np.int64 if wide else np.int32)
        return {"upto": upto, "members": members, "lengths": [self.lengths[p] for p in members],
                "total_length": self.total_length, "terms": terms,
                "arrays": [pack_array(np.asarray(x, dtype=dtype)) for x in (indptr, pos, tf)]}

    def _restore(self, graph: ContextGraph) -> None:
        """Start from the session's snapshot, when it is one of this graph's results."""
        data = graph.derived.take_value(BM25_SNAPSHOT, 0)
        msgs = graph.messages
        if not isinstance(data, dict) or not 0 < data.get("upto", 0) <= len(msgs):
            return
        members = data["members"]
        if any(not (0 <= p < data["upto"]) or msgs[p].role != "tool" for p in members):
            return
        self.members = set(members)
        self.lengths = dict(zip(members, data["lengths"]))
        self.total_length = data["total_length"]
        arrays = [unpack_array(x) for x in data["arrays"]]
        self._packed_arrays = (arrays[0], arrays[1], arrays[2])
        self.packed = dict(zip(data["terms"], range(len(data["terms"]))))
        self.kept = data["upto"]

    def _keep(self, graph: ContextGraph) -> None:
        n = len(graph.messages)
        if graph.derived.persist and snapshot_due(n, self.kept):
            graph.derived.put_json(BM25_SNAPSHOT, 0, msgspec.json.encode(self._pack(n)).decode())
            self.kept = n

    def scores(self, graph: ContextGraph, corpus: list[int], query: str) -> np.ndarray:
        """BM25 score of each result at ``corpus`` (graph positions, any order) for ``query``; equal
        to ``bm25_scores([content of p for p in corpus], query)``."""
        q = _bm25_tokens([query])[0]
        with self.lock:
            if not self.members and not self.tokens and graph.derived.persist:
                self._restore(graph)
            self._set_corpus(graph, corpus)
            self._keep(graph)
            n = len(corpus)
            if not q or not self.total_length:
                return np.zeros(n)
            avg = np.float64(self.total_length) / n
            rank = {p: i for i, p in enumerate(corpus)}
            out = np.zeros(n, dtype=np.float32)
            contrib: dict[str, tuple[np.ndarray, np.ndarray]] = {}
            lengths = self.lengths
            for t in q:
                post = self._posting(t)
                if not post:
                    continue
                hit = contrib.get(t)
                if hit is None:
                    df = len(post)
                    idf = np.float32(math.log(1 + (n - df + 0.5) / (df + 0.5)))
                    tf = np.fromiter(post.values(), dtype=np.float64, count=len(post))
                    lens = np.fromiter((lengths[p] for p in post), dtype=np.int64, count=len(post))
                    tfc = tf / (self.K1 * ((1 - self.B) + self.B * lens / avg) + tf)
                    idx = np.fromiter((rank[p] for p in post), dtype=np.int64, count=len(post))
                    hit = contrib[t] = (idx, (np.float64(idf) * tfc).astype(np.float32))
                out[hit[0]] += hit[1]
            return np.asarray(out, dtype=float)


_BM25_INDEX = "baselines.bm25_index"  # graph.memo key


def bm25_index(graph: ContextGraph) -> BM25Index:
    """The :class:`BM25Index` of ``graph`` (one per graph object, kept while the graph lives)."""
    return graph.memo(_BM25_INDEX, BM25Index)


@register("cw-bm25", "ContextWeaver §4 Baselines (retrieval; BM25 as in SWE-bench)",
          "6 observations in full: the 3 most recent and the 3 older ones BM25 ranks best for the current step.")
class BM25Retrieval:
    """ContextWeaver's retrieval baseline (§4); see the module docstring."""

    Config = BM25Config

    def __init__(self, name: str = "cw-bm25", config: BM25Config | None = None) -> None:
        self.name, self.config = name, config or BM25Config()

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        cfg = self.config
        layout = Layout(graph, signals.counter, budget)
        if layout.fits_in_full:
            return layout.assemble_full(self.name)
        sel = layout.selection()
        n_recent = cfg.n_full - cfg.n_retrieved
        newest = list(reversed(layout.candidates))
        recent, older = newest[:n_recent], newest[n_recent:]
        for p in recent:
            if sel.fits(p):
                sel.take(p)
                layout.reasons[p] = f"kept: one of the {n_recent} most recent observations"
            else:
                layout.reasons[p] = "omitted: recent, but does not fit in B"
        if older and cfg.n_retrieved:
            scores = bm25_index(graph).scores(graph, older, current_step(graph))
            # descending and stable: the positive scores come first, so the first n_retrieved positive ones
            ranked = [i for i in np.argsort(-scores, kind="stable")[:cfg.n_retrieved] if scores[i] > 0]
            for i in ranked:
                p = older[i]
                if sel.fits(p):
                    sel.take(p)
                    layout.reasons[p] = f"kept: BM25 {scores[i]:.2f} for the current step"
                else:
                    layout.reasons[p] = f"omitted: BM25 {scores[i]:.2f}, but does not fit in B"
            values = scores.tolist()  # Python floats: same text as numpy's, formatted faster
            for i, p in enumerate(older):
                layout.reasons.setdefault(p, f"omitted: BM25 {values[i]:.2f}, not among the {cfg.n_retrieved} best older")
        return layout.assemble(self.name, sel)
