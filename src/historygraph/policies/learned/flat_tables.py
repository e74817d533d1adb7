"""Growable numpy arrays and the flat tables of the learned selector's per-graph state: each
set-valued fact of every stored tool result (its TFA values, identifiers, words, files) as flat
``(row, id, own)`` arrays over a per-graph vocabulary with postings per member, so that a render's
overlap sums over all results are a few ``np.bincount`` passes (:class:`Flat`)."""

from __future__ import annotations

import numpy as np

from historygraph.history.derived import pack_array


class Grow:
    """A numpy array that grows at its end (capacity doubling); ``view()`` is its filled part."""

    __slots__ = ("a", "n")

    def __init__(self, dtype: type, width: int = 0) -> None:
        self.a: np.ndarray = np.zeros((64, width) if width else 64, dtype)
        self.n = 0

    def extend(self, rows: list) -> None:
        k = len(rows)
        self.reserve(k)
        if k:
            self.a[self.n - k:self.n] = rows

    def reserve(self, k: int) -> None:
        """Add ``k`` rows of zeros at the end (filled in place by the caller)."""
        if self.n + k > len(self.a):
            new = np.zeros((max(2 * len(self.a), self.n + k),) + self.a.shape[1:], self.a.dtype)
            new[:self.n] = self.a[:self.n]
            self.a = new
        self.a[self.n:self.n + k] = 0
        self.n += k

    def view(self) -> np.ndarray:
        return self.a[:self.n]


_INDEX_MIN = 512  # entries added since the postings were last extended before they are merged in (and 1/32 of all)


def grow_of(a: np.ndarray) -> Grow:
    """A :class:`Grow` holding ``a`` (an array of its own, e.g. one read from a snapshot: used as
    the buffer, full; the next ``reserve`` doubles it)."""
    g = Grow.__new__(Grow)
    g.a = a if a.flags.writeable else a.copy()
    g.n = len(a)
    return g


class Flat:
    """The members of one set-valued fact of every result (its values, words, …) as flat
    ``(row, id, own)`` arrays over a per-graph vocabulary, so that ``Σ_{m ∈ S(r) ∩ Q} w(m)`` for
    every ``r`` is one ``np.bincount``. ``own``: the member was first held by that row (TFA
    attribution). Rows added are collected in lists and moved into the arrays when next read.

    The entries are also kept as postings (the rows holding each member, grouped by member), into
    which the entries added since are merged once there are enough of them (a copy, no sort of
    the postings); a query reads the postings of its members and the entries added since, so a
    render reads ``O(matches)``, not every entry."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self._queries: dict[int, tuple[frozenset[str], dict[str, int], int, list[str], np.ndarray]] = {}  # query_ids
        self.rows, self.ids, self.own = Grow(np.int32), Grow(np.int32), Grow(np.float64)
        self.df = Grow(np.int64)  # rows holding each vocabulary entry (a row's members are distinct)
        self._added: tuple[list[int], list[int], list[float]] = ([], [], [])
        self._indexed = 0  # entries in the postings
        self._post_rows, self._post_own = np.zeros(0, np.intp), np.zeros(0)
        self._indptr = np.zeros(1, np.intp)  # member i's postings: _post_rows[_indptr[i]:_indptr[i + 1]]

    def add(self, row: int, members: "list[str] | frozenset[str]", own: frozenset[str] = frozenset()) -> None:
        vocab = self.vocab
        rows, ids, owns = self._added
        k = len(ids)
        ids.extend([vocab.setdefault(m, len(vocab)) for m in members])
        rows.extend([row] * (len(ids) - k))
        owns.extend([float(m in own) for m in members] if own else [0.0] * (len(ids) - k))

    def lookup(self, members: "list[str] | set[str] | frozenset[str]") -> np.ndarray:
        """Vocabulary ids of the known ``members``, in their order (intp)."""
        get = self.vocab.get
        return np.array([i for m in members if (i := get(m)) is not None], dtype=np.intp)

    def _flush(self) -> None:
        if self._added[0]:
            new = np.asarray(self._added[1], dtype=np.int64)
            rows, ids, own = self._added
            self.rows.extend(rows)
            rows.clear()
            self.ids.extend(ids)
            ids.clear()
            self.own.extend(own)
            own.clear()
            self.df.reserve(len(self.vocab) - self.df.n)
            self.df.view()[:] += np.bincount(new, minlength=len(self.vocab))

    def counts(self) -> np.ndarray:
        """Rows holding each vocabulary entry (its document frequency)."""
        self._flush()
        return self.df.view()

    def sums(self, ids: np.ndarray, n: int, weights: "np.ndarray | None" = None, own: bool = False) -> np.ndarray:
        """``Σ weights[k]`` over the members ``ids[k]`` of each row's set, per row (``n`` rows; weights
        1 by default; only members first held by the row when ``own``). Each row's terms are added
        left to right from 0.0 in the order of ``ids`` (``np.bincount`` adds sequentially), which is
        the row's own order of its members when ``ids`` is in that order."""
        return self.sums_many([(ids, weights, own)], n)[0]

    def sums_many(self, queries: "list[tuple[np.ndarray, np.ndarray | None, bool]]", n: int) -> np.ndarray:
        """:meth:`sums` of each ``(ids, weights, own)`` of ``queries``, as the rows of one
        ``(len(queries), n)`` array, in the same numpy passes for all (a render asks for up to five
        per table, each a few members: the passes' fixed cost was most of it). The same bits as one
        :meth:`sums` per query: ``np.bincount`` over ``query · n + row`` adds each bin's terms in
        the order they come, which is each query's own order."""
        self._flush()
        total = self.ids.n
        if total - self._indexed > max(_INDEX_MIN, total // 32):
            self._index()
        nq = len(queries)
        ids = np.concatenate([q[0] for q in queries]) if nq > 1 else np.asarray(queries[0][0])
        ids = ids.astype(np.intp, copy=False)
        sizes = [len(q[0]) for q in queries]
        w = np.concatenate([np.ones(k) if q[1] is None else np.asarray(q[1], dtype=np.float64)
                            for q, k in zip(queries, sizes)]) if nq else np.zeros(0)
        which = np.repeat(np.arange(nq), sizes)  # the query of each of ids
        owns = np.array([bool(q[2]) for q in queries])
        out: np.ndarray = np.zeros((nq, n))  # float64 (np.bincount with weights)
        if self._indexed:  # the postings of the members, concatenated in the order of ids
            known = ids < len(self._indptr) - 1
            q, wq, qk = ids[known], w[known], which[known]
            starts, lens = self._indptr[q], self._indptr[q + 1] - self._indptr[q]
            at = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(int(lens.sum()))
            x = np.repeat(wq, lens)
            per = np.repeat(qk, lens)
            if owns.any():
                x = np.where(owns[per], x * self._post_own[at], x)
            out = np.bincount(per * n + self._post_rows[at], weights=x, minlength=nq * n).reshape(nq, n)
        if total > self._indexed:  # the entries added since, in their order
            full = np.zeros((nq, len(self.vocab)))
            full[which, ids] = w
            x = full[:, self.ids.a[self._indexed:total]]
            if owns.any():
                x[owns] = x[owns] * self.own.a[self._indexed:total]
            key = (np.arange(nq)[:, None] * n + self.rows.a[self._indexed:total]).ravel()
            out = out + np.bincount(key, weights=x.ravel(), minlength=nq * n).reshape(nq, n)
        return out

    def _index(self) -> None:
        """Merge the entries added since into the postings: each at the end of its member's rows
        (its row comes after them), in the order added."""
        a, total, size = self._indexed, self.ids.n, len(self.vocab)
        new = self.ids.a[a:total]
        order = np.argsort(new, kind="stable")
        indptr = self._indptr
        if len(indptr) < size + 1:  # members first seen since
            indptr = np.concatenate([indptr, np.full(size + 1 - len(indptr), indptr[-1])])
        at = indptr[new[order] + 1]
        self._post_rows = np.insert(self._post_rows, at, self.rows.a[a:total][order])
        self._post_own = np.insert(self._post_own, at, self.own.a[a:total][order])
        self._indptr = indptr + np.concatenate([[0], np.cumsum(np.bincount(new, minlength=size))])
        self._indexed = total


    def packed(self) -> list:
        """The table as JSON-ready data (numeric arrays by :func:`~historygraph.history.derived.pack_array`),
        the postings completed first so that a table read back does not sort them again:
        ``[vocabulary, rows, ids, own, df, entries indexed, posting rows, posting own, posting offsets]``."""
        self._flush()
        if self.ids.n > self._indexed:  # the postings complete, so a reopened graph does not sort them again
            self._index()
        return [list(self.vocab), pack_array(self.rows.view()), pack_array(self.ids.view()), pack_array(self.own.view()),
                pack_array(self.df.view()), self._indexed, pack_array(self._post_rows), pack_array(self._post_own),
                pack_array(self._indptr)]

    @classmethod
    def restored(cls, vocab: list[str], rows: np.ndarray, ids: np.ndarray, own: np.ndarray, df: np.ndarray,
                 indexed: int, post_rows: np.ndarray, post_own: np.ndarray, indptr: np.ndarray) -> Flat:
        """The table :meth:`packed` packed, from its vocabulary and its arrays unpacked (each an
        array of its own)."""
        fl = cls()
        fl.vocab = dict(zip(vocab, range(len(vocab))))
        fl.rows, fl.ids, fl.own, fl.df = (grow_of(x) for x in (rows, ids, own, df))
        fl._indexed = indexed
        fl._post_rows, fl._post_own, fl._indptr = post_rows, post_own, indptr
        return fl


def query_ids(flat: Flat, query: frozenset[str]) -> np.ndarray:
    """``[flat.vocab.get(w, -1) for w in sorted(query)]`` (intp), kept on ``flat`` per query (the
    task's words are asked for at every render): an id never changes, so when the vocabulary has
    grown only the words unknown before are looked up again. The kept array is never changed
    in place (a grown vocabulary gives a new one)."""
    vocab = flat.vocab
    kept: dict[int, tuple[frozenset[str], dict[str, int], int, list[str], np.ndarray]] | None = \
        getattr(flat, "_queries", None)
    if kept is None:
        kept = flat._queries = {}
    hit = kept.get(id(query))
    if hit is not None and hit[0] is query and hit[1] is vocab:
        _, _, size, ordered, ids = hit
        if size != len(vocab):
            ids = ids.copy()
            for j in (ids < 0).nonzero()[0].tolist():
                ids[j] = vocab.get(ordered[j], -1)
            kept[id(query)] = (query, vocab, len(vocab), ordered, ids)
        return ids
    ordered = sorted(query)
    get = vocab.get
    ids = np.fromiter((get(w, -1) for w in ordered), dtype=np.intp, count=len(ordered))
    if len(kept) >= 8:  # the task's and a few latest messages'
        kept.clear()
    kept[id(query)] = (query, vocab, len(vocab), ordered, ids)
    return ids

