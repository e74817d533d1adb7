"""Parent selection (ContextWeaver §3.1, §3.3 "Low-cost configuration"): the low-cost score of a
candidate parent (shared files, shared identifiers, recency; formula in
:mod:`historygraph.signals.steps`) and the selector that keeps the best ``max_parents``, with its
``from_postings`` that makes the same picks from an inverted index of the steps' features."""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from historygraph.signals.int_table import LOG1P, IntTable
from historygraph.signals.steps.features import Step


@dataclass(frozen=True)
class ParentScoring:
    """Weights of the low-cost parent score (module docstring); defaults are ours."""

    max_parents: int = 3
    w_files: float = 1.0
    w_identifiers: float = 0.5
    w_recency: float = 1.0
    recency_decay: float = 0.8


#: ``selector(steps, k, eligible) -> parents``: ``steps[:k+1]`` are built, ``eligible`` lists the
#: candidate indices (< k, status passed/unknown), oldest first.
Selector = Callable[[list[Step], int, list[int]], tuple[int, ...]]


def score_parent(cand: Step, cur: Step, cfg: ParentScoring) -> float | None:
    """The low-cost score of ``cand`` as a parent of ``cur``; ``None`` when they share nothing."""
    f = len(cand.files & cur.files)
    i = len(cand.identifiers & cur.identifiers)
    if f + i == 0:
        return None
    return _shared_score(f, i, cur.index - 1 - cand.index, cfg)


def _shared_score(files: int, identifiers: int, gap: int, cfg: ParentScoring) -> float:
    """The low-cost score of a parent sharing ``files`` files and ``identifiers`` identifiers with
    the step ``gap + 1`` steps after it (module docstring)."""
    return (cfg.w_files * min(files, 3) + cfg.w_identifiers * math.log1p(identifiers)
            + cfg.w_recency * cfg.recency_decay ** gap)


def _shared_counts(files: list, identifiers: list, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The step indices below ``k`` in any of the postings ``files`` and ``identifiers`` (lists of
    step indices), ascending, and in how many of ``files`` and of ``identifiers`` each is (int64)."""
    nf, ni = sum(map(len, files)), sum(map(len, identifiers))
    ids = np.fromiter(itertools.chain(*files, *identifiers), dtype=np.int64, count=nf + ni)
    shared, inverse = np.unique(ids, return_inverse=True)
    f = np.bincount(inverse[:nf], minlength=len(shared))
    i = np.bincount(inverse[nf:], minlength=len(shared))
    below = int(np.searchsorted(shared, k))
    return shared[:below], f[:below], i[:below]


@functools.cache
def _powers_of(decay: float) -> IntTable:
    """``decay ** gap`` by Python's ``**``, tabulated (kept per process: selectors are made per call)."""
    return IntTable(lambda gap: decay ** gap)


class LowCostSelector:
    """The selector of the paper's low-cost configuration (§3.3). Its ``from_postings(steps, k,
    files, identifiers)`` makes the same picks from the postings of step ``k``'s files and
    identifiers in the inverted index of :func:`build_steps` (per file, per identifier, the indices
    of the steps having it: ``files`` and ``identifiers`` list one posting per file and per
    identifier of step ``k``), without intersecting the steps' sets again: the shared counts of
    every earlier step are taken at once (``numpy.bincount``) and scored at once, with the same
    bits as :func:`_shared_score` (``ln(1 + i)`` and ``decay^gap`` each put through :mod:`math`
    and Python's ``**`` once, the terms added in its order), and only the best ones are checked
    for their status (passed or unknown), so a step whose status is never read is never built."""

    shared_only = True  # a candidate sharing no file or identifier scores None: never chosen

    def __init__(self, cfg: ParentScoring) -> None:
        self.cfg = cfg
        self.decay = _powers_of(cfg.recency_decay)
        # a pure function of the steps: its picks are kept with a stored session, under a name of its weights
        self.stored_as = "lowcost-" + hashlib.blake2b(repr(cfg).encode(), digest_size=6).hexdigest()

    def pick(self, scored: list[tuple[float, int]]) -> tuple[int, ...]:
        scored.sort(key=lambda t: (t[0], t[1]), reverse=True)  # ties: the more recent first
        return tuple(i for _, i in scored[:self.cfg.max_parents])

    def __call__(self, steps: list[Step], k: int, eligible: list[int]) -> tuple[int, ...]:
        cfg = self.cfg
        return self.pick([(s, i) for i in eligible if (s := score_parent(steps[i], steps[k], cfg)) is not None])

    def from_postings(self, steps: list[Step], k: int, files: list, identifiers: list) -> tuple[int, ...]:
        cfg, log1p, decay = self.cfg, LOG1P, self.decay
        shared, f, i = _shared_counts(files, identifiers, k)  # (a step's index is its place in ``steps``)
        if not len(shared):
            return ()
        score = cfg.w_files * np.minimum(f, 3) + cfg.w_identifiers * log1p(i) + cfg.w_recency * decay(k - 1 - shared)
        out: list[int] = []
        for j in np.lexsort((shared, score))[::-1].tolist():  # best first, ties: the more recent first
            s = int(shared[j])
            if steps[s].validation_status in ("passed", "unknown"):
                out.append(s)
                if len(out) == cfg.max_parents:
                    break
        return tuple(out[:cfg.max_parents])  # (max_parents ≤ 0: every eligible one collected, cut as pick cuts)


def lowcost_selector(cfg: ParentScoring) -> LowCostSelector:
    """The :class:`LowCostSelector` of ``cfg`` (a :data:`Selector`)."""
    return LowCostSelector(cfg)
