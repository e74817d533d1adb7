"""The step view of a graph (ContextWeaver §3.1, §3.3): every step with its validation status,
superseded pointer and parents, kept per graph and selector and extended as the graph grows (a
step whose results arrive late is built again with the steps after it), with the parents and the
whole view kept with a stored session; and the ancestry of a step, breadth-first up its parents."""

from __future__ import annotations

import bisect
from collections import defaultdict, deque
from dataclasses import dataclass, field

import msgspec
import numpy as np

from historygraph.history.derived import DerivedKind, snapshot_due
from historygraph.history.graph import ContextGraph
from historygraph.signals.steps.features import STEP_FEATURES, STEP_MODULES, Step, graph_cache, step_features
from historygraph.signals.steps.parents import ParentScoring, Selector, lowcost_selector
from historygraph.signals.steps.stored import (DECODE, INDEX_KEYS, VIEW_PARTS, LazyIndex, StepIndex, StoredColumns,
                                               fresh_step, lazy_steps, same_results)
from historygraph.signals.test_output import supersedes

def parents_kind(stored_as: str) -> DerivedKind:
    """Derived rows of the parents a pure selector (one with a ``stored_as`` name, such as the
    low-cost one per :class:`ParentScoring`) picked for each step: ``[messages, parents]``, with the
    number of messages the graph held when they were picked; used only when no message from that
    position on is a result for a call of the step or of an earlier one (:func:`_chosen_from_same`)."""
    return DerivedKind(f"steps.parents:{stored_as}", STEP_MODULES)


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
    return [fresh_step(s) for s in _view(graph, selector, selector_key)]


def _view(graph: ContextGraph, selector: Selector, selector_key: str) -> list[Step]:
    cache = graph_cache(graph)
    with cache["lock"]:  # renders of one graph in two threads share the index
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
    packed by :func:`~historygraph.history.derived.pack_array`: :class:`StoredColumns`) and, for a
    ``shared_only`` selector, the inverted index (``"files"``, ``"identifiers"``: the steps having
    each). The steps are those of the graph's assistant messages below ``upto``. A reopened
    session's first view starts from it (a step built when first read, its action, files and
    identifiers when first used, :class:`~historygraph.signals.steps.stored._Loader`) and is extended from there as a kept view is;
    it is used only when every step it holds has the results the graph gives it among the first
    ``upto`` messages."""
    return DerivedKind(f"steps.view:{stored_as}", STEP_MODULES)


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
        parts = VIEW_PARTS(text) if text is not None else None
        data = {k: v if k in INDEX_KEYS else DECODE(v) for k, v in parts.items()} if parts is not None else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        data = None
    msgs = graph.messages
    if not isinstance(data, dict) or type(data.get("upto")) is not int or not 0 < data["upto"] <= len(msgs):
        return
    upto = data["upto"]
    if type(data.get("failed")) is not list or type(data.get("open")) is not list or \
            (shared_only and not all(k in data for k in INDEX_KEYS)):  # (a snapshot of another selector's shape)
        return
    turn = np.asarray(graph.turn_of[:upto], dtype=np.int64)  # a turn begins at each assistant message
    positions = np.flatnonzero(np.diff(turn, prepend=0)).tolist()
    stored = StoredColumns.read(data, positions)
    # the steps are those of these messages, with the same results: each step's calls' results
    # before ``upto``, in call order (all steps' at once from the graph's call map, in call order)
    if stored is None or not same_results(graph, positions, stored, upto):
        return
    cache.setdefault("stored", {})[selector_key] = stored
    steps = view.steps = lazy_steps(stored, graph)  # each step built when first read
    view.failed, view.undo, view.open = list(data["failed"]), list(stored.undo), list(data["open"])
    if shared_only:
        cache["index"] = LazyIndex(files=data["files"], identifiers=data["identifiers"], of_step=StepIndex(steps))
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
    data: dict = {"upto": view.upto, **StoredColumns.data(steps, view.undo), "failed": view.failed, "open": view.open}
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
        step = step_features(graph, k, pos, results, fcache)
        steps.append(step)
        view.undo.append(_supersede(steps, failed, step))
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
                if by_file is None or by_ident is None:  # (both read at once)
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
            if by_file is None or by_ident is None:
                by_file, by_ident = index["files"], index["identifiers"]
            _index_step(by_file, by_ident, of_step, step)
    view.upto = len(msgs)


def _supersede(steps: list[Step], failed: list[int], step: Step) -> tuple[int, ...]:
    """Mark ``superseded`` by ``step`` (the latest of ``steps``) every failed step whose failure its
    test run fixes (:func:`~historygraph.signals.test_output.supersedes`), removing them from
    ``failed``; the steps so marked, for a rollback."""
    undone: list[int] = []
    k = step.index
    if step.test_results is not None and failed:
        for i in list(failed):
            earlier = steps[i]
            if earlier.test_results is not None and supersedes(step.test_results, step.action,
                                                               earlier.test_results, earlier.action):
                earlier.validation_status, earlier.superseded_by = "superseded", k
                failed.remove(i)
                undone.append(i)
    return tuple(undone)


def _index_step(by_file: dict, by_ident: dict, of_step: dict, step: Step) -> None:
    """Put ``step`` in the inverted index (the postings of its files and identifiers), replacing the
    step indexed under its number when that one's features differ (its observation arrived since)."""
    k = step.index
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
    cache = graph_cache(graph)
    with cache["lock"]:
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
