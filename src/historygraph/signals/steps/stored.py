"""A step view read back from its stored snapshot (:func:`~historygraph.signals.steps.view.view_kind`):
the snapshot's columns checked for shape and against the graph's results, and the steps, their
features and the inverted index built or decoded only when first read, so that a reopened
session's first view reads the few steps it looks at, not every step."""

from __future__ import annotations

import itertools
import json
import operator
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import fields
from typing import Any, SupportsIndex, overload

import msgspec
import numpy as np

from historygraph.history.derived import pack_array, unpack_array
from historygraph.history.graph import ContextGraph
from historygraph.signals.steps.features import STEP_FEATURES, Step, extract, run_data, run_of


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
                value = extract(self.messages, position, results, with_run=False)[:3]
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

    __hash__ = None  # type: ignore[assignment]  # (as Step's: mypy takes a dataclass's from object)

    def copy(self) -> Step:
        """A copy that stays unread until used, sharing the loader."""
        c = _StoredStep.__new__(_StoredStep)
        c.__dict__.update(self.__dict__)
        c.summary = None
        return c


_STATUS = {"passed": "p", "failed": "f", "unknown": "u", "superseded": "s"}  # a step's status as one letter
_STATUS_OF = {v: k for k, v in _STATUS.items()}


class StoredColumns:
    """The steps of a :func:`view_kind` snapshot as columns, checked for shape (:meth:`read`):
    ``n`` steps at ``positions``; step ``k``'s results ``results_flat[result_ends[k]:result_ends[k + 1]]``
    and parents likewise; ``status[k]`` its status letter (:data:`_STATUS`); ``superseded_by``,
    ``runs`` (test runs as :func:`run_data` gives them) and ``undo`` only for the steps that have
    one."""

    __slots__ = ("n", "positions", "result_counts", "result_array", "results_flat", "result_ends",
                 "parents_flat", "parent_ends", "status", "superseded_by", "runs", "undo")
    n: int
    positions: list[int]
    result_counts: np.ndarray
    result_array: np.ndarray
    results_flat: list[int]
    result_ends: list[int]
    parents_flat: list[int]
    parent_ends: list[int]
    status: str
    superseded_by: dict[int, int]
    runs: dict[int, list]
    undo: list[tuple[int, ...]]

    @classmethod
    def read(cls, data: dict, positions: list[int]) -> "StoredColumns | None":
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
                "runs": [[k, run_data(s.test_results)] for k, s in enumerate(steps) if s.test_results is not None],
                "undo": [[k, list(u)] for k, u in enumerate(undo) if u]}


def same_results(graph: ContextGraph, positions: list[int], stored: "StoredColumns", upto: int) -> bool:
    """Whether every stored step (at ``positions``) lists as its results the positions below
    ``upto`` of its calls' latest results, in call order (what a step built from the graph's first
    ``upto`` messages holds): from the graph's call map, whose order is the calls' order (messages
    appended in order, each message's calls in order), compared with the stored columns as arrays.
    A message naming one call id twice (the call map holds it once) is checked call by call."""
    msgs, result_of, call_owner = graph.messages, graph.result_of, graph.call_owner
    calls = sum(map(len, map(_TOOL_CALLS, map(msgs.__getitem__, positions))))
    owners = np.fromiter(call_owner.values(), dtype=np.int64, count=len(call_owner))
    if calls + int((owners >= upto).sum()) != len(call_owner):
        return all(list(stored.results(k)) == [r for c in msgs[pos].tool_calls if (r := result_of.get(c.id, upto)) < upto]
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

    def __init__(self, stored: "StoredColumns", messages: list, load: "_Loader") -> None:
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
                                 test_results=run_of(st.runs.get(k)), validation_status=_STATUS_OF[st.status[k]],
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

    @overload
    def __getitem__(self, k: SupportsIndex) -> Step: ...

    @overload
    def __getitem__(self, k: slice) -> list[Step]: ...

    def __getitem__(self, k: SupportsIndex | slice) -> Step | list[Step]:
        if isinstance(k, slice):
            return [self._at(i) for i in range(*k.indices(len(self)))]
        return self._at(operator.index(k))

    def _all(self) -> list[Step]:
        if self.raw:
            for k in range(min(len(self), self.stored.n)):
                self._at(k)
        return list.__getitem__(self, slice(None))

    def __iter__(self) -> Iterator[Step]:
        return iter(self._all())

    def __reversed__(self) -> Iterator[Step]:
        return reversed(self._all())

    def __contains__(self, x: object) -> bool:
        return x in self._all()

    def __eq__(self, other: object) -> bool:
        return self._all() == (other._all() if isinstance(other, _LazySteps) else other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None

    def __repr__(self) -> str:
        return repr(self._all())

    def index(self, *a: Any) -> int:
        return self._all().index(*a)

    def count(self, x: Any) -> int:
        return self._all().count(x)

    def copy(self) -> list[Step]:
        return list(self._all())

    def pop(self, k: int = -1) -> Step:  # type: ignore[override]
        item = self._at(k)
        list.pop(self, k)
        return item


VIEW_PARTS = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
DECODE = msgspec.json.Decoder().decode
INDEX_KEYS = ("files", "identifiers")


class LazyIndex(dict):
    """The per-graph inverted index read from a snapshot: ``files`` and ``identifiers`` kept as
    their JSON text until first read (then ``defaultdict(list)`` of the decoded lists, as built)."""

    def __getitem__(self, key: str) -> object:
        v = dict.__getitem__(self, key)
        if type(v) is msgspec.Raw:
            try:
                decoded = DECODE(v)
            except msgspec.DecodeError:
                decoded = json.loads(bytes(v))
            v = defaultdict(list, decoded)
            dict.__setitem__(self, key, v)
        return v


class StepIndex(dict):
    """``of_step`` of the per-graph index of a view read from a snapshot (the step indexed as step
    ``k``): for a stored row, the step built for it (:meth:`_LazySteps.original`, built when asked
    for) unless another was indexed since."""

    def __init__(self, steps: _LazySteps) -> None:
        super().__init__()
        self.steps, self.n = steps, steps.stored.n

    def get(self, k: int, default: object = None) -> object:
        if dict.__contains__(self, k):
            return dict.__getitem__(self, k)
        if type(k) is int and 0 <= k < self.n:
            return self.steps.original(k)
        return default

    def __len__(self) -> int:
        return self.n + sum(1 for k in dict.keys(self) if not 0 <= k < self.n)


def lazy_steps(stored: StoredColumns, graph: ContextGraph) -> _LazySteps:
    """The steps of the snapshot columns ``stored`` as a list whose entries are built when first
    read (:class:`_LazySteps`), their features read by one :class:`_Loader` of ``graph``."""
    return _LazySteps(stored, graph.messages, _Loader(graph))


def fresh_step(s: Step) -> Step:
    """A fresh copy of the view's step ``s`` (a caller may set its ``summary``): a stored step whose
    features are not read yet stays unread (:meth:`_StoredStep.copy`)."""
    return (s.copy() if type(s) is _StoredStep and "_load" in s.__dict__ else
            Step(s.index, s.position, s.results, s.thought, s.action, s.files, s.identifiers, s.test_results,
                 s.validation_status, s.superseded_by, s.parents))
