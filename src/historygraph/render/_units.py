"""Units and runs of a layout, kept in the forms that make a render cheap. A reader may skip this
module; each form must equal its plain reference:

* :class:`Unit`, a droppable group of history (a user message, or an assistant message with its
  results); :class:`Units` builds each when first read and must equal the list of units built
  from the render order at once; :class:`UnitsView` must equal a list copy of them with the
  layout's own replacements;
* :class:`Runs`, runs of consecutive marked units, kept as their bounds alone: must equal a dict
  from every marked unit to the first unit of its run (``tests/test_equivalence.py``);
* :class:`Spans`, the units the oldest-first drop left out: must equal the set of them."""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Mapping, Sequence, Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np

@dataclass(slots=True)
class Unit:
    """A droppable group of history: one user message, or an assistant message with its results."""

    positions: list[int]
    protected: bool
    cost: int = 0


class Units:
    """A skeleton's units (a list of :class:`Unit`), each built when first read from the render
    order, where each unit starts in it, its size and its cost (a reopened session's first render
    reads a few of its thousands). Appended to and popped at the end as a list; :meth:`view` gives
    a layout its own list-like copy."""

    __slots__ = ("order", "starts", "sizes", "costs", "built", "missing")

    def __init__(self, order: list[int] | None = None, starts: list[int] | None = None,
                 sizes: list[int] | None = None, costs: list[int] | None = None) -> None:
        self.order, self.starts, self.sizes, self.costs = order or [], starts or [], sizes or [], costs or []
        self.built: list[Unit | None] = [None] * len(self.starts)
        self.missing = len(self.starts)  # entries of ``built`` still None

    def __len__(self) -> int:
        return len(self.built)

    def __bool__(self) -> bool:
        return bool(self.built)

    def unit(self, i: int) -> Unit:
        if i < 0:
            i += len(self.built)
        u = self.built[i]
        if u is None:
            s = self.starts[i]
            u = self.built[i] = Unit(self.order[s:s + self.sizes[i]], False, self.costs[i])
            self.missing -= 1
        return u

    def __getitem__(self, i: int) -> Unit:
        return self.unit(i)

    def append(self, unit: Unit) -> None:
        self.built.append(unit)

    def pop(self) -> Unit:
        u = self.unit(len(self.built) - 1)
        self.built.pop()
        return u

    def all(self) -> list[Unit | None]:
        """``built`` with every unit built."""
        if self.missing:
            for i in [i for i, u in enumerate(self.built) if u is None]:
                self.unit(i)
        return self.built

    def view(self) -> "UnitsView":
        """A list-like copy of the units as they are now (the last one built: extending the
        skeleton pops and rebuilds only that one)."""
        if self.built:
            self.unit(len(self.built) - 1)
        return UnitsView(self, len(self.built))


class UnitsView(Sequence[Unit]):
    """:class:`Layout.units`: the skeleton's units at the time of the layout (``n`` of them, read
    from the skeleton's :class:`Units`, which only ever adds beyond them or replaces its last
    one, built at the view's creation), with the layout's own replacements."""

    __slots__ = ("base", "n", "own")

    def __init__(self, base: Units, n: int) -> None:
        self.base, self.n = base, n
        self.own: dict[int, Unit] = {}
        if n:
            self.own[n - 1] = base.unit(n - 1)  # (the skeleton may replace its last unit later)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        if type(i) is int and 0 <= i < self.n:  # the common case first: a unit already built
            u = self.own.get(i)
            if u is None:
                u = self.base.built[i]
                if u is None:
                    u = self.base.unit(i)
            return u
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError("unit index out of range")
        u = self.own.get(i)
        return u if u is not None else self.base.unit(i)

    def __setitem__(self, i: int, unit: Unit) -> None:
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError("unit index out of range")
        self.own[i] = unit

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (UnitsView, list)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))

    def __iter__(self) -> Iterator[Unit]:
        units = self.base.all()[:self.n]
        for i, u in self.own.items():
            units[i] = u
        return iter(units)  # type: ignore[arg-type]


BULK_AFTER = 16  # remove_delta questions on one run before the whole run is priced in bulk


def weakly(method: Callable[[int, int], Any]) -> Callable[[int, int], Any]:
    """The bound ``method`` called through a weak reference to its object. A layout's runs call back
    into the layout (marker costs); with the bound method itself, layout → runs → method → layout
    was a reference cycle, so every rendering's layout, its units and lists (about 270 objects)
    waited for the cyclic garbage collector instead of being freed when the render returned: in
    the proxy, a young collection every few requests (bench/RESULTS.md). Whoever holds a layout's
    runs holds the layout too (a :class:`Selection` keeps its ``layout``)."""
    ref, func = weakref.ref(method.__self__), method.__func__  # type: ignore[attr-defined]

    def call(a: int, b: int) -> Any:
        return func(ref(), a, b)
    return call


class Runs:
    """Runs of consecutive marked units (no rendered message between them), each standing for one
    dropped-step marker. ``glue[i]`` says whether unit ``i`` may share a run with unit ``i − 1``;
    ``cost(a, b)`` is the marker's tokens for units ``a..b``. ``end[a]`` is the last unit of the
    run starting at ``a``; ``run_of(i)`` (or ``start[i]``, a read-only view) the first unit of the
    run holding ``i``. Kept as the runs' bounds alone (O(runs) to copy or split, not O(units): a
    long history's oldest-first drop is one run of thousands of units)."""

    def __init__(self, glue: list[bool], cost: Callable[[int, int], int],
                 bulk: Callable[[int, int], np.ndarray] | None = None) -> None:
        self.glue, self.cost, self.bulk = glue, cost, bulk
        self.end: dict[int, int] = {}
        self._firsts: list[int] = []  # the keys of ``end``, ascending
        self._asked: dict[tuple[int, int], int] = {}  # remove_delta questions per run

    @property
    def start(self) -> "_RunStarts":
        """``start[i]``: the first unit of the run holding unit ``i`` (a read-only mapping)."""
        return _RunStarts(self)

    def run_of(self, i: int) -> int | None:
        """The first unit of the run holding unit ``i``, ``None`` when ``i`` is not marked."""
        firsts = self._firsts
        k = bisect.bisect_right(firsts, i) - 1
        if k >= 0:
            a = firsts[k]
            if self.end[a] >= i:
                return a
        return None

    def _first(self, i: int) -> int:
        a = self.run_of(i)
        if a is None:
            raise KeyError(i)
        return a

    def copy(self) -> "Runs":
        other = Runs(self.glue, self.cost, self.bulk)
        other.end, other._firsts = dict(self.end), list(self._firsts)
        return other

    def set_run(self, a: int, b: int) -> None:
        """Mark units ``a..b`` as one new run (none of them marked, no run next to it to join)."""
        bisect.insort(self._firsts, a)
        self.end[a] = b

    def _pop_run(self, a: int) -> int:
        b = self.end.pop(a)
        del self._firsts[bisect.bisect_left(self._firsts, a)]
        return b

    def _neighbours(self, i: int) -> tuple[int | None, int | None]:
        left = self.run_of(i - 1) if i > 0 and self.glue[i] else None
        right = i + 1 if i + 1 < len(self.glue) and self.glue[i + 1] and (i + 1) in self.end else None
        return left, right

    def add_delta(self, i: int) -> int:
        """Marker tokens added by marking unit ``i`` (not marked yet)."""
        left, right = self._neighbours(i)
        a = left if left is not None else i
        b = self.end[right] if right is not None else i
        return self.cost(a, b) - (self.cost(left, i - 1) if left is not None else 0) \
            - (self.cost(right, self.end[right]) if right is not None else 0)

    def add(self, i: int) -> None:
        left, right = self._neighbours(i)
        a = left if left is not None else i
        b = self._pop_run(right) if right is not None else i
        if left is not None:
            self._pop_run(left)
        self.set_run(a, b)

    def add_sorted(self, units: list[int]) -> None:
        """``add(i)`` for each of ``units`` (ascending) on runs with none marked yet, in bulk: the runs
        are the stretches of consecutive units joined by glue."""
        if self.end or not units:
            for i in units:
                self.add(i)
            return
        a = prev = units[0]
        for i in units[1:] + [-1]:
            if i == prev + 1 and self.glue[i]:
                prev = i
                continue
            self.set_run(a, prev)
            a = prev = i

    def remove_delta(self, i: int) -> int:
        """Marker tokens added (negative: saved) by unmarking unit ``i`` (a revived step)."""
        a = self._first(i)
        b = self.end[a]
        if self.bulk is not None:  # a run asked about often is priced for all its units at once
            n = self._asked[(a, b)] = self._asked.get((a, b), 0) + 1
            if n > BULK_AFTER:
                return int(self.bulk(a, b)[i - a])
        return (self.cost(a, i - 1) if i > a else 0) + (self.cost(i + 1, b) if i < b else 0) - self.cost(a, b)

    def remove(self, i: int) -> None:
        a = self._first(i)
        b = self._pop_run(a)
        if i > a:
            self.set_run(a, i - 1)
        if i < b:
            self.set_run(i + 1, b)

    def total(self) -> int:
        return sum(self.cost(a, b) for a, b in self.end.items())


class Spans(AbstractSet[int]):
    """The units :meth:`Layout._drop_oldest` drops, kept as spans of consecutive units (a long
    history drops thousands per render, in one or two spans): membership is O(spans). It is
    iterated, and combined with other sets, as the set built by adding the spans in order
    (``set(range(a, b + 1))``, then ``update`` with each next span), built on first use."""

    __slots__ = ("spans", "_set")

    def __init__(self) -> None:
        self.spans: list[tuple[int, int]] = []  # (first, last), ascending
        self._set: set[int] | None = None

    def add_span(self, a: int, b: int) -> None:
        """Add units ``a..b``, after every unit held so far."""
        self.spans.append((a, b))
        self._set = None

    def as_set(self) -> set[int]:
        if self._set is None:
            out: set[int] = set()
            for k, (a, b) in enumerate(self.spans):
                if k:
                    out.update(range(a, b + 1))
                else:
                    out = set(range(a, b + 1))
            self._set = out
        return self._set

    def __contains__(self, u: object) -> bool:
        for a, b in self.spans:
            if a <= u <= b:  # type: ignore[operator]
                return True
        return False

    def __iter__(self) -> Iterator[int]:
        return iter(self.as_set())

    def __len__(self) -> int:
        return sum(b - a + 1 for a, b in self.spans)

    def __bool__(self) -> bool:
        return bool(self.spans)

    @classmethod
    def _from_iterable(cls, it: Iterable[int]) -> set[int]:  # type: ignore[override]
        return set(it)

    def __and__(self, other: Any) -> set[int]:
        return self.as_set() & other

    def __sub__(self, other: Any) -> set[int]:
        return self.as_set() - other

    def __or__(self, other: Any) -> set[int]:
        return self.as_set() | other


class _RunStarts(Mapping[int, int]):
    """``Runs.start`` as a read-only mapping: unit → first unit of its run, for the marked units."""

    __slots__ = ("runs",)

    def __init__(self, runs: Runs) -> None:
        self.runs = runs

    def __getitem__(self, i: int) -> int:
        a = self.runs.run_of(i)
        if a is None:
            raise KeyError(i)
        return a

    def __contains__(self, i: object) -> bool:
        return self.runs.run_of(i) is not None  # type: ignore[arg-type]

    def get(self, i: int, default: Any = None) -> Any:
        a = self.runs.run_of(i)
        return default if a is None else a

    def __iter__(self) -> Iterator[int]:
        for a in self.runs._firsts:
            yield from range(a, self.runs.end[a] + 1)

    def __len__(self) -> int:
        return sum(b - a + 1 for a, b in self.runs.end.items())

    def __bool__(self) -> bool:
        return bool(self.runs.end)
