"""ContextWeaver steps: a view of the context graph as thought–action–observation nodes.

Source: ContextWeaver §3.1 (node extraction, parent selection, ancestry) and §3.3 (validation).

* **Step** (node ``N_k``): one assistant message (thought = its text, action = its tool calls)
  with the tool results that answer it (observation). Steps are numbered 0, 1, … in transcript
  order; an assistant message without tool calls is a step without observation.
* **Files** a step touches: path-like tokens with a source/config/document extension, read from
  the thought, the action and the observation (URLs are ignored). Files are compared by file name
  (last path component), because agents name one file as ``/testbed/pkg/a.py``, ``./pkg/a.py``
  and ``a.py``. **Identifiers**, from the action and the observation: code-like names of at least
  four characters with an inner underscore (``get_offset``), an inner capital (``LintResult``,
  ``parseArgs``) or an acronym before a word (``HTTPError``). Only the first
  :data:`FEATURE_CHARS` characters of the observation are read.
* **Validation** (§3.3): each step's ``test_results`` is the :class:`~.tests.TestRun` parsed from
  its observation; ``validation_status`` comes from it (``unknown`` without one). When step ``k``
  fixes an earlier failure (:func:`~.tests.supersedes`) the earlier step becomes ``superseded``
  and ``superseded_by`` points at ``k``.
* **Parent selection** is incremental, as in the paper: when step ``k`` is added, its parents are
  chosen among earlier steps whose status *at that moment* is ``passed`` or ``unknown`` (failed and
  superseded steps are skipped). The low-cost selector (§3.3 "Low-cost configuration": shared
  files, shared identifiers, recency; the weights are ours, the paper gives none) scores a
  candidate ``i`` that shares at least one file or identifier with ``k`` by

      score(i, k) = w_files · min(|F_i ∩ F_k|, 3) + w_ids · ln(1 + |I_i ∩ I_k|) + w_rec · ρ^(k − 1 − i)

  and keeps the ``max_parents`` best (ties to the more recent). Another selector (the LLM
  analyzer) can be passed as a callable.
* **Ancestry** (§3.1): breadth-first search up the parent edges from the current step, stopping
  when the queue is empty or ``W`` ancestors are collected. Ancestors inside the always-full recent
  window and ancestors without an observation are traversed but not counted, so ``W`` bounds the
  number of *earlier* observations kept in full (the paper keeps three, §5.5).

Extracted features and chosen parents are cached per graph object (the graph is append-only), so
a replay extracts each step once. A graph handed out by a store also keeps them with the session
(:mod:`historygraph.history.derived`): a step's features as :data:`STEP_FEATURES` rows, checked against the
step's result positions; the low-cost selector's parents as :func:`parents_kind` rows, with the
number of messages the graph held when they were chosen, used only when no later message is a
result for that step or an earlier one (then every step up to it, what they were chosen from, has
the results it had), so a reopened session's first view reads them instead of recomputing them.
The whole view of a pure selector is also kept, as one :func:`view_kind` snapshot rewritten when
the graph has grown by a quarter, so that a reopened session's first view builds no step from its
rows: it starts from the snapshot, reads a step's features when first used, and extends the view
from the snapshot's length.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import json
import math
import operator
import re
import threading
import weakref
from collections import defaultdict, deque
from dataclasses import dataclass, field, fields
from typing import Callable

import msgspec
import numpy as np

from historygraph.history.derived import DerivedKind, pack_array, snapshot_due, unpack_array
from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.signals.int_table import LOG1P, IntTable
from historygraph.signals.test_output import TestRun, parse_test_output, supersedes, validation_status

_MODULES = ("historygraph.signals.steps", "historygraph.signals.test_output")
STEP_FEATURES = DerivedKind("steps.features", _MODULES)
"""Derived rows of each step, at its assistant message's position: ``[results, action, files,
identifiers, test run]`` (:func:`_run_data`), used only for the same result positions."""


def parents_kind(stored_as: str) -> DerivedKind:
    """Derived rows of the parents a pure selector (one with a ``stored_as`` name, such as the
    low-cost one per :class:`ParentScoring`) picked for each step: ``[messages, parents]``, with the
    number of messages the graph held when they were picked; used only when no message from that
    position on is a result for a call of the step or of an earlier one (:func:`_chosen_from_same`)."""
    return DerivedKind(f"steps.parents:{stored_as}", _MODULES)

FEATURE_CHARS = 20_000
_EXT = ("py|pyi|pyx|js|jsx|ts|tsx|go|rs|java|kt|c|h|cc|cpp|hpp|cs|rb|php|swift|scala|sh|sql|json|ya?ml|toml|"
        "cfg|ini|txt|md|rst|html|css|xml|csv|lock|dcm")
_FILE = re.compile(rf"(?<![\w.\-/])(/?(?:[\w.\-]+/)*[\w\-][\w.\-]*\.(?:{_EXT}))(?![\w\-])")
_URL = re.compile(r"\w+://\S+")
_IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]{3,}\b")
_CODE_LIKE = re.compile(r"[A-Za-z0-9]_[A-Za-z0-9]|[a-z][A-Z]|[A-Z]{2}[a-z]")


def files_in(text: str) -> frozenset[str]:
    """File names (last path component) of the paths in ``text`` (kept for the latest texts
    asked about: :func:`_recall`)."""
    return _recall(0, text, _files_in)


def identifiers_in(text: str) -> frozenset[str]:
    """Code-like identifiers in ``text`` (rule in the module docstring; kept for the latest texts
    asked about: :func:`_recall`)."""
    return _recall(1, text, _identifiers_in)


_PATH_RUN = re.compile(r"[\w.\-/]+")  # the characters of _FILE's paths and of its lookbehind
_FILE_AT = re.compile(rf"/?(?:[\w.\-]+/)*[\w\-][\w.\-]*\.(?:{_EXT})(?![\w\-])")  # _FILE without the lookbehind


def _files_in(text: str) -> frozenset[str]:
    """``_FILE.findall`` of ``text`` with URLs blanked (``_URL.sub``), as the start of each longest
    run of path characters (``[\\w.\\-/]``) that ``_FILE_AT`` matches there: _FILE's lookbehind lets
    a path start only where no path character precedes it, that is at such a run's start, and a
    path is made of them, so each run holds at most one (a scan of every position cost ≈ 0.3 µs a
    character); runs without a dot hold none. ``tests/test_contextweaver.py`` checks it against
    ``_FILE`` on real traces."""
    if "://" in text:  # (no URL without it)
        text = _URL.sub(" ", text)
    out = set()
    match = _FILE_AT.match
    for run in _PATH_RUN.findall(text):
        if "." in run and (m := match(run)) is not None:
            out.add(m.group().rsplit("/", 1)[-1])
    return frozenset(out)


def _identifiers_in(text: str) -> frozenset[str]:
    return frozenset(t for t in set(_IDENT.findall(text)) if _CODE_LIKE.search(t))  # each distinct token tested once


_RECALL: dict[tuple[int, str], frozenset[str]] = {}
_RECALL_SIZE = 128   # texts kept (a render asks about a few new ones)
_RECALL_CHARS = 128  # shorter texts are not kept (matching them costs about what a lookup does)


def _recall(kind: int, text: str, fn: Callable[[str], frozenset[str]]) -> frozenset[str]:
    """``fn(text)``, kept for the last :data:`_RECALL_SIZE` texts: a new result's text is matched
    for the learned selector's facts (:mod:`historygraph.policies.learned.features`) and for its step
    (:func:`_extract`, one result at a time), the latest assistant message's for its facts and
    for the render's features. A string's hash is computed once per string object."""
    if len(text) < _RECALL_CHARS:
        return fn(text)
    key = (kind, text)
    hit = _RECALL.get(key)
    if hit is None:
        if len(_RECALL) >= _RECALL_SIZE:
            _RECALL.clear()
        hit = _RECALL[key] = fn(text)
    return hit


def action_text(graph: ContextGraph, position: int) -> str:
    """The action of the assistant message at ``position``: each call as ``name: command`` (the
    ``command``/``cmd`` argument when the arguments are JSON with one, else the raw arguments)."""
    return _action_of(graph.messages[position])


def _action_of(message: Message) -> str:
    """:func:`action_text` of ``message``."""
    parts = []
    for c in message.tool_calls:
        args = c.arguments
        try:
            data = json.loads(args)
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("command", data.get("cmd")), str):
            args = data.get("command", data.get("cmd"))
        parts.append(f"{c.name}: {args}")
    return "\n".join(parts)


@dataclass
class Step:
    """One node ``N_k`` (see module docstring).

    Attributes:
        index: step number ``k`` (0-based, transcript order).
        position: graph position of the assistant message.
        results: graph positions of its tool results (the observation), in call order.
        thought, action: the assistant text and :func:`action_text`.
        files, identifiers: features of action + observation.
        test_results: the parsed test run of the observation, or ``None``.
        validation_status: ``passed``, ``failed``, ``unknown`` or ``superseded``.
        superseded_by: index of the step that fixed this failure, or ``None``.
        parents: indices of the steps it builds on, most important first.
        summary: the node summary once a policy has made one (≤ 300 characters), else ``None``.
    """

    index: int
    position: int
    results: tuple[int, ...]
    thought: str
    action: str
    files: frozenset[str]
    identifiers: frozenset[str]
    test_results: TestRun | None
    validation_status: str = "unknown"
    superseded_by: int | None = None
    parents: tuple[int, ...] = ()
    summary: str | None = None


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


def lowcost_selector(cfg: ParentScoring) -> Selector:
    """The selector of the paper's low-cost configuration (§3.3). Its ``from_postings(steps, k,
    files, identifiers)`` makes the same picks from the postings of step ``k``'s files and
    identifiers in the inverted index of :func:`build_steps` (per file, per identifier, the indices
    of the steps having it: ``files`` and ``identifiers`` list one posting per file and per
    identifier of step ``k``), without intersecting the steps' sets again: the shared counts of
    every earlier step are taken at once (``numpy.bincount``) and scored at once, with the same
    bits as :func:`_shared_score` (``ln(1 + i)`` and ``decay^gap`` each put through :mod:`math`
    and Python's ``**`` once, the terms added in its order), and only the best ones are checked
    for their status (passed or unknown), so a step whose status is never read is never built."""

    def pick(scored: list[tuple[float, int]]) -> tuple[int, ...]:
        scored.sort(key=lambda t: (t[0], t[1]), reverse=True)  # ties: the more recent first
        return tuple(i for _, i in scored[:cfg.max_parents])

    def select(steps: list[Step], k: int, eligible: list[int]) -> tuple[int, ...]:
        return pick([(s, i) for i in eligible if (s := score_parent(steps[i], steps[k], cfg)) is not None])

    log1p, decay = LOG1P, _powers_of(cfg.recency_decay)

    def from_postings(steps: list[Step], k: int, files: list, identifiers: list) -> tuple[int, ...]:
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

    select.shared_only = True  # a candidate sharing no file or identifier scores None: never chosen
    select.from_postings = from_postings
    # a pure function of the steps: its picks are kept with a stored session, under a name of its weights
    select.stored_as = "lowcost-" + hashlib.blake2b(repr(cfg).encode(), digest_size=6).hexdigest()
    return select


_CACHE: "weakref.WeakKeyDictionary[ContextGraph, dict]" = weakref.WeakKeyDictionary()


def _run_data(run: TestRun | None) -> list | None:
    """A test run as JSON-ready data (the inverse of :func:`_run_of`)."""
    if run is None:
        return None
    return [run.framework, run.passed, run.failed, run.errors, run.skipped, run.results, [list(t) for t in run.tracebacks]]


def _run_of(data: list | None) -> TestRun | None:
    if data is None:
        return None
    framework, passed, failed, errors, skipped, results, tracebacks = data
    return TestRun(framework, passed, failed, errors, skipped, dict(results), tuple((a, b) for a, b in tracebacks))


def _first_owner_from(graph: ContextGraph, start: int = 0) -> list[int]:
    """``out[q]``: the lowest position of an assistant message whose call a tool result at position
    ``q`` or later answers (``len(graph)`` when none; ``out[len(graph)]`` too), for
    :func:`_chosen_from_same`; for ``q ≥ start`` only (−1 below it: no row is used there)."""
    msgs, call_owner = graph.messages, graph.call_owner
    n = len(msgs)
    out = [-1] * start + [n] * (n + 1 - start)
    low = n
    for q in range(n - 1, start - 1, -1):
        m = msgs[q]
        if m.role == "tool":
            o = call_owner.get(m.tool_call_id or "", n)
            if o < low:
                low = o
        out[q] = low
    return out


def _chosen_from_same(first_owner_from: list[int], position: int, messages: object) -> bool:
    """Whether parents picked for the step at ``position`` when the graph held ``messages``
    messages were picked from the steps it has now: every step up to it had the results it has
    (the messages are immutable and append-only, so the steps' positions are the same, and only a
    result stored later, answering that step or an earlier one, changes what a step holds)."""
    return type(messages) is int and position < messages < len(first_owner_from) and first_owner_from[messages] > position


def _extract(messages: list, position: int, results: tuple[int, ...], with_run: bool = True) -> tuple:
    """``(action, files, identifiers, test run)`` of the step at ``position`` with ``results``
    (the run ``None`` unless ``with_run``)."""
    m = messages[position]
    action = _action_of(m)
    contents = [messages[p].content for p in results]
    obs = "\n".join(contents)
    pieces = _head_pieces(contents, obs)
    files = files_in(action).union(files_in(m.content), *map(files_in, pieces))
    idents = identifiers_in(action).union(*map(identifiers_in, pieces))
    return (action, files, idents, parse_test_output(obs) if obs and with_run else None)


def _head_pieces(contents: list[str], obs: str) -> list[str]:
    """The first :data:`FEATURE_CHARS` characters of ``obs`` (``contents`` joined by newlines) cut
    at the newlines that join them: the whole contents that fit, then what fits of the next. No
    file name or identifier holds a newline or is cut by one (the patterns' classes and lookarounds
    exclude it, and a newline is a boundary as the text's ends are), so those of the joined text
    (``files_in(a + "\\n" + b)``) are those of its pieces together, and a result's own text, as
    its learned facts ask about it, is matched once (:func:`_recall`)."""
    out: list[str] = []
    at = 0
    for c in contents:
        if at + len(c) > FEATURE_CHARS:
            out.append(obs[at:FEATURE_CHARS])
            break
        out.append(c)
        at += len(c) + 1
        if at > FEATURE_CHARS:
            break
    return out


def _features(graph: ContextGraph, index: int, position: int, results: tuple[int, ...], cache: dict | None = None) -> Step:
    if cache is None:
        cache = _CACHE.setdefault(graph, {"features": {}, "parents": {}})["features"]
    key = (position, results)
    if key not in cache:
        row = graph.derived.take_value(STEP_FEATURES, position)
        if row is not None and tuple(row[0]) == results:
            cache[key] = (row[1], frozenset(row[2]), frozenset(row[3]), _run_of(row[4]))
        else:
            cache[key] = feats = _extract(graph.messages, position, results)
            graph.derived.put(STEP_FEATURES, position, [list(results), feats[0], sorted(feats[1]), sorted(feats[2]),
                                                        _run_data(feats[3])])
    action, files, idents, run = cache[key]
    return Step(index, position, results, graph.messages[position].content, action, files, idents, run,
                validation_status(run))


class _Loader:
    """The action, files and identifiers of the steps of a view read from a stored snapshot
    (:func:`view_kind`): a step's :data:`STEP_FEATURES` row when that is for the same results,
    else computed again from the messages; each read once, on first use, and shared by the step's
    copies. Holds the graph's message list and derived rows, not the graph (the per-graph cache
    is keyed weakly by the graph)."""

    __slots__ = ("messages", "derived", "memo")

    def __init__(self, graph: ContextGraph) -> None:
        self.messages, self.derived = graph.messages, graph.derived
        self.memo: dict[tuple[int, tuple[int, ...]], tuple[str, frozenset[str], frozenset[str]]] = {}

    def get(self, position: int, results: tuple[int, ...]) -> tuple[str, frozenset[str], frozenset[str]]:
        key = (position, results)
        value = self.memo.get(key)
        if value is None:
            row = self.derived.take_value(STEP_FEATURES, position)
            if row is not None and tuple(row[0]) == results:
                value = (row[1], frozenset(row[2]), frozenset(row[3]))
            else:
                value = _extract(self.messages, position, results, with_run=False)[:3]
            value = self.memo.setdefault(key, value)
        return value


_STEP_FIELDS = tuple(f.name for f in fields(Step))


class _StoredStep(Step):
    """A :class:`Step` of a view read from a stored snapshot whose ``action``, ``files`` and
    ``identifiers`` are read by its :class:`_Loader` when first asked for (a first render of a
    reopened session reads the features of the few steps it looks at, not of every step)."""

    def __getattr__(self, name: str) -> object:
        if name in ("action", "files", "identifiers"):
            load = self.__dict__.get("_load")
            if load is not None:
                self.action, self.files, self.identifiers = load.get(self.position, self.results)
                del self.__dict__["_load"]
                return self.__dict__[name]
        raise AttributeError(name)

    def __eq__(self, other: object) -> bool:  # equal to a plain Step with the same fields
        if not isinstance(other, Step):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in _STEP_FIELDS)

    __hash__ = None  # type: ignore[assignment]  (as Step's)

    def copy(self) -> Step:
        """A copy that stays unread until used, sharing the loader."""
        c = _StoredStep.__new__(_StoredStep)
        c.__dict__.update(self.__dict__)
        c.summary = None
        return c


_STATUS = {"passed": "p", "failed": "f", "unknown": "u", "superseded": "s"}  # a step's status as one letter
_STATUS_OF = {v: k for k, v in _STATUS.items()}


class _StoredColumns:
    """The steps of a :func:`view_kind` snapshot as columns, checked for shape (:meth:`read`):
    ``n`` steps at ``positions``; step ``k``'s results ``results_flat[result_ends[k]:result_ends[k + 1]]``
    and parents likewise; ``status[k]`` its status letter (:data:`_STATUS`); ``superseded_by``,
    ``runs`` (test runs as :func:`_run_data` gives them) and ``undo`` only for the steps that have
    one."""

    __slots__ = ("n", "positions", "result_counts", "result_array", "results_flat", "result_ends",
                 "parents_flat", "parent_ends", "status", "superseded_by", "runs", "undo")

    @classmethod
    def read(cls, data: dict, positions: list[int]) -> "_StoredColumns | None":
        """The columns of a decoded snapshot ``data`` for the steps at ``positions`` (the graph's
        assistant messages below its ``upto``), or ``None`` when they do not have that shape."""
        n = len(positions)
        try:
            counts, flat = unpack_array(data["result_counts"]), unpack_array(data["results"])
            pcounts, parents = unpack_array(data["parent_counts"]), unpack_array(data["parents"])
            status, sup, runs, undo = data["status"], data["superseded_by"], data["runs"], data["undo"]
        except (KeyError, TypeError, ValueError):
            return None
        arrays = (counts, flat, pcounts, parents)
        if data.get("steps") != n or any(a.ndim != 1 or a.dtype.kind not in "iu" for a in arrays):
            return None
        if len(counts) != n or len(pcounts) != n or int(counts.sum()) != len(flat) or int(pcounts.sum()) != len(parents):
            return None
        if (n and min(int(counts.min()), int(pcounts.min())) < 0) or \
                type(status) is not str or len(status) != n or not set(status) <= _STATUS_OF.keys():
            return None
        for pairs in (sup, runs, undo):  # [[step, value], …] for the steps that have one
            if type(pairs) is not list or \
                    not all(type(e) is list and len(e) == 2 and type(e[0]) is int and 0 <= e[0] < n for e in pairs):
                return None
        if not all(type(j) is int for _, j in sup) or not all(type(r) is list and len(r) == 7 for _, r in runs) or \
                not all(type(u) is list for _, u in undo):
            return None
        c = cls()
        c.n, c.positions, c.result_counts, c.result_array = n, positions, counts, flat
        c.results_flat, c.result_ends = flat.tolist(), [0, *np.cumsum(counts).tolist()]
        c.parents_flat, c.parent_ends = parents.tolist(), [0, *np.cumsum(pcounts).tolist()]
        c.status, c.superseded_by, c.runs = status, dict(sup), dict(runs)
        c.undo = [()] * n
        for k, u in undo:
            c.undo[k] = tuple(u)
        return c

    def results(self, k: int) -> tuple[int, ...]:
        return tuple(self.results_flat[self.result_ends[k]:self.result_ends[k + 1]])

    def parents(self, k: int) -> tuple[int, ...]:
        return tuple(self.parents_flat[self.parent_ends[k]:self.parent_ends[k + 1]])

    def parents_for(self, k: int, results: int) -> tuple[int, ...] | None:
        """Step ``k``'s stored parents when it had ``results`` results (a step built again after a
        rollback, with its results as stored), else ``None``."""
        if k < self.n and self.result_ends[k + 1] - self.result_ends[k] == results:
            return self.parents(k)
        return None

    @staticmethod
    def data(steps: list[Step], undo: list[tuple[int, ...]]) -> dict:
        """The columns of ``steps`` (and each step's ``undo``) as JSON-ready data for :meth:`read`."""
        def packed(seqs: list[tuple[int, ...]]) -> tuple[list, list]:
            counts = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
            flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(counts.sum()))
            return pack_array(counts), pack_array(flat)
        result_counts, results = packed([s.results for s in steps])
        parent_counts, parents = packed([s.parents for s in steps])
        return {"steps": len(steps), "result_counts": result_counts, "results": results,
                "parent_counts": parent_counts, "parents": parents,
                "status": "".join(_STATUS[s.validation_status] for s in steps),
                "superseded_by": [[k, s.superseded_by] for k, s in enumerate(steps) if s.superseded_by is not None],
                "runs": [[k, _run_data(s.test_results)] for k, s in enumerate(steps) if s.test_results is not None],
                "undo": [[k, list(u)] for k, u in enumerate(undo) if u]}


def _same_results(graph: ContextGraph, positions: list[int], stored: "_StoredColumns", upto: int) -> bool:
    """Whether every stored step (at ``positions``) lists as its results the positions below
    ``upto`` of its calls' latest results, in call order (what a step built from the graph's first
    ``upto`` messages holds): from the graph's call map, whose order is the calls' order (messages
    appended in order, each message's calls in order), compared with the stored columns as arrays.
    A message naming one call id twice (the call map holds it once) is checked call by call."""
    msgs, result_of, call_owner = graph.messages, graph.result_of, graph.call_owner
    calls = sum(map(len, map(_TOOL_CALLS, map(msgs.__getitem__, positions))))
    owners = np.fromiter(call_owner.values(), dtype=np.int64, count=len(call_owner))
    if calls + int((owners >= upto).sum()) != len(call_owner):
        return all(list(stored.results(k)) == [q for c in msgs[pos].tool_calls if (q := result_of.get(c.id, upto)) < upto]
                   for k, pos in enumerate(positions))
    ids = itertools.islice(call_owner, calls)  # the calls of the first ``upto`` messages (their owners come first)
    q = np.array(list(map(result_of.get, ids, itertools.repeat(upto))), dtype=np.int64)  # (fromiter over map: 3× slower)
    owner = owners[:calls]
    answered = q < upto
    # per step, how many of its calls have a result before upto, and those results in call order
    per_step = np.bincount(np.searchsorted(np.asarray(positions, dtype=np.int64), owner[answered]), minlength=len(positions))
    return np.array_equal(per_step, stored.result_counts) and np.array_equal(q[answered], stored.result_array)


_TOOL_CALLS = operator.attrgetter("tool_calls")


class _LazySteps(list):
    """The steps of a view read from a stored snapshot: a list whose entries for the stored rows
    are built (:class:`_StoredStep`) when first read, by index or by iteration (a first render of a
    reopened session reads the few steps of the latest ancestry, not every step). Appended to and
    popped at the end as a list. Every way of reading an entry builds it first; :meth:`original`
    gives the step built for a stored row even after it was popped."""

    def __init__(self, stored: "_StoredColumns", messages: list, load: "_Loader") -> None:
        super().__init__(itertools.repeat(None, stored.n))
        self.stored, self.messages, self.load = stored, messages, load
        self.built: dict[int, Step] = {}
        self.raw = stored.n  # entries not built yet (``None``)

    def original(self, k: int) -> Step:
        """The step of stored row ``k``, built once."""
        step = self.built.get(k)
        if step is None:
            st = self.stored
            pos = st.positions[k]
            step = _StoredStep.__new__(_StoredStep)
            step.__dict__.update(index=k, position=pos, results=st.results(k), thought=self.messages[pos].content,
                                 test_results=_run_of(st.runs.get(k)), validation_status=_STATUS_OF[st.status[k]],
                                 superseded_by=st.superseded_by.get(k), parents=st.parents(k), summary=None,
                                 _load=self.load)
            self.built[k] = step
        return step

    def _at(self, k: int) -> Step:
        item = list.__getitem__(self, k)
        if item is None:  # a stored step not built yet
            if k < 0:
                k += len(self)
            item = self.original(k)
            list.__setitem__(self, k, item)
            self.raw -= 1
        return item

    def __getitem__(self, k):  # type: ignore[no-untyped-def,override]
        if isinstance(k, slice):
            return [self._at(i) for i in range(*k.indices(len(self)))]
        return self._at(k)

    def _all(self) -> list[Step]:
        if self.raw:
            for k in range(min(len(self), self.stored.n)):
                self._at(k)
        return list.__getitem__(self, slice(None))

    def __iter__(self):  # type: ignore[no-untyped-def,override]
        return iter(self._all())

    def __reversed__(self):  # type: ignore[no-untyped-def,override]
        return reversed(self._all())

    def __contains__(self, x: object) -> bool:
        return x in self._all()

    def __eq__(self, other: object) -> bool:
        return self._all() == (other._all() if isinstance(other, _LazySteps) else other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._all())

    def index(self, *a):  # type: ignore[no-untyped-def,override]
        return self._all().index(*a)

    def count(self, x: object) -> int:
        return self._all().count(x)

    def copy(self) -> list[Step]:  # type: ignore[override]
        return list(self._all())

    def pop(self, k: int = -1) -> Step:  # type: ignore[override]
        item = self._at(k)
        list.pop(self, k)
        return item


_VIEW_PARTS = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_DECODE = msgspec.json.Decoder().decode
_INDEX_KEYS = ("files", "identifiers")


class _LazyIndex(dict):
    """The per-graph inverted index read from a snapshot: ``files`` and ``identifiers`` kept as
    their JSON text until first read (then ``defaultdict(list)`` of the decoded lists, as built)."""

    def __getitem__(self, key: str) -> object:
        v = dict.__getitem__(self, key)
        if type(v) is msgspec.Raw:
            try:
                decoded = _DECODE(v)
            except msgspec.DecodeError:
                decoded = json.loads(bytes(v))
            v = defaultdict(list, decoded)
            dict.__setitem__(self, key, v)
        return v


class _StepIndex(dict):
    """``of_step`` of the per-graph index of a view read from a snapshot (the step indexed as step
    ``k``): for a stored row, the step built for it (:meth:`_LazySteps.original`, built when asked
    for) unless another was indexed since."""

    def __init__(self, steps: _LazySteps) -> None:
        super().__init__()
        self.steps, self.n = steps, steps.stored.n

    def get(self, k: int, default: object = None) -> object:  # type: ignore[override]
        if dict.__contains__(self, k):
            return dict.__getitem__(self, k)
        if type(k) is int and 0 <= k < self.n:
            return self.steps.original(k)
        return default

    def __len__(self) -> int:
        return self.n + sum(1 for k in dict.keys(self) if not 0 <= k < self.n)


@dataclass
class _View:
    """The steps of one graph for one selector, extended as the graph grows: ``upto`` messages
    read; ``undo[k]`` the earlier steps that step ``k`` marked superseded; ``open`` the steps some
    of whose calls have no result yet (ascending), rebuilt from the first whose results arrive."""

    upto: int = 0
    steps: list[Step] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)  # steps whose status is "failed", ascending
    undo: list[tuple[int, ...]] = field(default_factory=list)
    open: list[int] = field(default_factory=list)


def build_steps(graph: ContextGraph, selector: Selector, selector_key: str) -> list[Step]:
    """All steps of ``graph`` with validation statuses, superseded pointers and parents (fresh
    :class:`Step` objects: a caller may set their ``summary``).

    ``selector_key`` names the selector in the per-graph parent cache (a step's parents depend only
    on earlier steps, so they are chosen once per selector). A selector marked ``shared_only``
    (the low-cost one: a candidate that shares no file or identifier cannot be a parent) chooses
    by its ``from_postings`` from the postings of the step's files and identifiers in an inverted
    index of the steps' features kept per graph, so the first view of an ``n``-step graph costs far
    less than scoring all ``n²/2`` pairs. The superseded check visits only the steps still failed. The view
    is kept per graph and selector and extended when the graph grows: only new steps are built,
    and a step whose results arrive after it was built is built again with the steps after it
    (their superseding undone first), so the view equals one built from scratch.
    """
    return [s.copy() if type(s) is _StoredStep and "_load" in s.__dict__ else
            Step(s.index, s.position, s.results, s.thought, s.action, s.files, s.identifiers, s.test_results,
                 s.validation_status, s.superseded_by, s.parents) for s in _view(graph, selector, selector_key)]


def _view(graph: ContextGraph, selector: Selector, selector_key: str) -> list[Step]:
    cache = _CACHE.setdefault(graph, {"features": {}, "parents": {}})
    with cache.setdefault("lock", threading.RLock()):  # renders of one graph in two threads share the index
        views = cache.setdefault("views", {})
        view = views.get(selector_key)
        if view is None or view.upto > len(graph.messages):
            view = views[selector_key] = _View()
            _restore(graph, cache, view, selector, selector_key)
        _extend(graph, cache, view, selector, selector_key)
        _keep(graph, cache, view, selector, selector_key)
        return view.steps


def view_kind(stored_as: str) -> DerivedKind:
    """The derived row (position 0) of a whole view of a pure selector's steps at a known number of
    messages: ``{"upto", "steps", "result_counts", "results", "parent_counts", "parents", "status",
    "superseded_by", "runs", "undo", "failed", "open"}`` (the steps as columns, the integer ones
    packed by :func:`~historygraph.history.derived.pack_array`: :class:`_StoredColumns`) and, for a
    ``shared_only`` selector, the inverted index (``"files"``, ``"identifiers"``: the steps having
    each). The steps are those of the graph's assistant messages below ``upto``. A reopened
    session's first view starts from it (a step built when first read, its action, files and
    identifiers when first used, :class:`_Loader`) and is extended from there as a kept view is;
    it is used only when every step it holds has the results the graph gives it among the first
    ``upto`` messages."""
    return DerivedKind(f"steps.view:{stored_as}", _MODULES)


def _restore(graph: ContextGraph, cache: dict, view: _View, selector: Selector, selector_key: str) -> None:
    """Fill an empty ``view`` from the stored snapshot of its selector, when there is a valid one
    and the per-graph index is still empty (it is shared by the views of one graph). The stored
    parents are kept for steps built again after a rollback (``cache["stored"]``)."""
    stored_as = getattr(selector, "stored_as", None)
    shared_only = getattr(selector, "shared_only", False)
    if stored_as is None or not graph.derived.persist or (shared_only and "index" in cache):
        return
    text = graph.derived.take_text(view_kind(stored_as), 0)
    try:  # the inverted index decoded when first used (a view's new steps need it; a first render has none)
        parts = _VIEW_PARTS(text) if text is not None else None
        data = {k: v if k in _INDEX_KEYS else _DECODE(v) for k, v in parts.items()} if parts is not None else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        data = None
    msgs = graph.messages
    if not isinstance(data, dict) or type(data.get("upto")) is not int or not 0 < data["upto"] <= len(msgs):
        return
    upto = data["upto"]
    if type(data.get("failed")) is not list or type(data.get("open")) is not list or \
            (shared_only and not all(k in data for k in _INDEX_KEYS)):  # (a snapshot of another selector's shape)
        return
    turn = np.asarray(graph.turn_of[:upto], dtype=np.int64)  # a turn begins at each assistant message
    positions = np.flatnonzero(np.diff(turn, prepend=0)).tolist()
    stored = _StoredColumns.read(data, positions)
    # the steps are those of these messages, with the same results: each step's calls' results
    # before ``upto``, in call order (all steps' at once from the graph's call map, in call order)
    if stored is None or not _same_results(graph, positions, stored, upto):
        return
    cache.setdefault("stored", {})[selector_key] = stored
    steps = view.steps = _LazySteps(stored, msgs, _Loader(graph))  # each step built when first read
    view.failed, view.undo, view.open = list(data["failed"]), list(stored.undo), list(data["open"])
    if shared_only:
        cache["index"] = _LazyIndex(files=data["files"], identifiers=data["identifiers"], of_step=_StepIndex(steps))
    view.upto = upto
    cache.setdefault("kept", {})[selector_key] = upto


def _keep(graph: ContextGraph, cache: dict, view: _View, selector: Selector, selector_key: str) -> None:
    """Put the view's snapshot (:func:`view_kind`) for the store to write, when the graph has grown
    by :data:`historygraph.history.derived.SNAPSHOT_GROWTH` since the last one (read or put) and the per-graph index holds
    exactly this view's steps."""
    stored_as = getattr(selector, "stored_as", None)
    n = len(graph.messages)
    kept = cache.setdefault("kept", {})
    if stored_as is None or not graph.derived.persist or not snapshot_due(n, kept.get(selector_key, 0)):
        return
    steps = list(view.steps)
    data: dict = {"upto": view.upto, **_StoredColumns.data(steps, view.undo), "failed": view.failed, "open": view.open}
    if getattr(selector, "shared_only", False):
        index = cache["index"]
        of_step = index["of_step"]
        if len(of_step) != len(steps) or any(of_step.get(k) is not s for k, s in enumerate(steps)):
            return  # another view of the graph indexed steps of its own
        # (a part still as it was read is written as its text)
        data["files"], data["identifiers"] = dict.__getitem__(index, "files"), dict.__getitem__(index, "identifiers")
    graph.derived.put_json(view_kind(stored_as), 0, msgspec.json.encode(data).decode())
    kept[selector_key] = n


def _extend(graph: ContextGraph, cache: dict, view: _View, selector: Selector, selector_key: str) -> None:
    msgs, result_of = graph.messages, graph.result_of
    for k in view.open:  # the first step whose results changed, and every step after it, are built again
        s = view.steps[k]
        if len(s.results) != sum(c.id in result_of for c in msgs[s.position].tool_calls):
            _rollback(view, k)
            break
    pcache, fcache = cache["parents"], cache["features"]
    stored = cache.get("stored", {}).get(selector_key)
    shared_only = getattr(selector, "shared_only", False)
    if shared_only:  # per file name and per identifier the steps that have it
        index = cache.setdefault("index", {"files": defaultdict(list), "identifiers": defaultdict(list), "of_step": {}})
        of_step = index["of_step"]
        by_file = by_ident = None  # read when a new step needs them
    steps, failed = view.steps, view.failed
    stored_as = getattr(selector, "stored_as", None)
    if stored_as is not None:
        kind = parents_kind(stored_as)
        if view.upto == 0:  # a whole view: its rows decoded at once
            graph.derived.table(kind)
            graph.derived.table(STEP_FEATURES)
        first_owner_from: list[int] | None = None
    start = view.upto
    for pos in range(view.upto, len(msgs)):
        m = msgs[pos]
        if m.role != "assistant":
            continue
        results = tuple(result_of[c.id] for c in m.tool_calls if c.id in result_of)
        k = len(steps)
        step = _features(graph, k, pos, results, fcache)
        steps.append(step)
        undone: list[int] = []
        if step.test_results is not None and failed:
            for i in list(failed):
                earlier = steps[i]
                if earlier.test_results is not None and supersedes(step.test_results, step.action,
                                                                   earlier.test_results, earlier.action):
                    earlier.validation_status, earlier.superseded_by = "superseded", k
                    failed.remove(i)
                    undone.append(i)
        view.undo.append(tuple(undone))
        if step.validation_status == "failed":
            failed.append(k)
        if len(results) < len(m.tool_calls):
            view.open.append(k)
        key = (selector_key, k, len(results))
        if key not in pcache and stored is not None and (chosen := stored.parents_for(k, len(results))) is not None:
            pcache[key] = chosen  # (a step of the snapshot built again after a rollback)
        if stored_as is not None and key not in pcache:
            row = graph.derived.take_value(kind, pos)
            if row is not None:
                if first_owner_from is None:
                    first_owner_from = _first_owner_from(graph, start)
                if _chosen_from_same(first_owner_from, pos, row[0]):
                    pcache[key] = tuple(row[1])
        if key not in pcache:
            if shared_only:
                if by_file is None:
                    by_file, by_ident = index["files"], index["identifiers"]
                # the postings of this step's files and identifiers: each earlier step is once in the
                # postings of each of its own, so its count there is the size of the sets' intersection
                pcache[key] = tuple(selector.from_postings(steps, k, [by_file.get(x, ()) for x in step.files],  # type: ignore[attr-defined]
                                                           [by_ident.get(x, ()) for x in step.identifiers]))
            else:
                eligible = [i for i in range(k) if steps[i].validation_status in ("passed", "unknown")]
                pcache[key] = tuple(selector(steps, k, eligible)) if eligible else ()
            if stored_as is not None:
                graph.derived.put(kind, pos, [len(msgs), list(pcache[key])])
        step.parents = pcache[key]
        if shared_only:
            if by_file is None:
                by_file, by_ident = index["files"], index["identifiers"]
            old = of_step.get(k)  # the step indexed as step k
            if old is None or (old is not step and (old.files != step.files or old.identifiers != step.identifiers)):
                # a new step, or its observation arrived since it was indexed
                if old is not None:
                    for x in old.files:
                        by_file[x].remove(k)
                    for x in old.identifiers:
                        by_ident[x].remove(k)
                for x in step.files:
                    by_file[x].append(k)
                for x in step.identifiers:
                    by_ident[x].append(k)
            of_step[k] = step
    view.upto = len(msgs)


def _rollback(view: _View, k0: int) -> None:
    """Return ``view`` to the state before step ``k0`` was built (steps ``k0…`` removed, the
    supersedings they made undone); reading resumes at step ``k0``'s message."""
    view.upto = view.steps[k0].position
    for j in range(len(view.steps) - 1, k0 - 1, -1):
        for i in view.undo[j]:
            earlier = view.steps[i]
            earlier.validation_status, earlier.superseded_by = "failed", None
            bisect.insort(view.failed, i)
        if view.failed and view.failed[-1] == j:
            view.failed.pop()
        view.steps.pop()
        view.undo.pop()
    view.open = [k for k in view.open if k < k0]


def lowcost_steps(graph: ContextGraph, scoring: ParentScoring = ParentScoring()) -> list[Step]:
    """:func:`build_steps` with the low-cost selector; one parent cache per scoring, shared by
    every policy that uses it (ContextWeaver, ``contextrender-dep``)."""
    return build_steps(graph, lowcost_selector(scoring), f"lowcost:{scoring}")


def latest_ancestry_results(graph: ContextGraph, max_ancestors: int, scoring: ParentScoring = ParentScoring()) -> list[int]:
    """Graph positions of the results of the ancestors of the latest step (:func:`ancestry` over
    :func:`lowcost_steps`, ``max_ancestors`` counted), read from the kept view without copying it;
    ``[]`` for a graph without steps."""
    cache = _CACHE.setdefault(graph, {"features": {}, "parents": {}})
    with cache.setdefault("lock", threading.RLock()):
        steps = _view(graph, lowcost_selector(scoring), f"lowcost:{scoring}")
        if not steps:
            return []
        return [p for i in ancestry(steps, len(steps) - 1, max_ancestors) for p in steps[i].results]


def ancestry(steps: list[Step], k: int, max_ancestors: int, uncounted: frozenset[int] | set[int] = frozenset()) -> list[int]:
    """Ancestors of step ``k`` in breadth-first order (§3.1), stopping at ``max_ancestors`` counted
    ones. Steps in ``uncounted`` (the recent window) and steps without an observation are visited
    and expanded but not counted."""
    seen = {k}
    queue = deque(steps[k].parents)
    out: list[int] = []
    counted = 0
    while queue and counted < max_ancestors:
        i = queue.popleft()
        if i in seen:
            continue
        seen.add(i)
        out.append(i)
        if i not in uncounted and steps[i].results:
            counted += 1
        queue.extend(steps[i].parents)
    return out
