"""Assembly of a rendering and the invariants every rendering must hold (docs/architecture.md, invariant §5).

Every policy renders through :class:`Layout`, so budget accounting and tool-call pairing are
implemented once:

* **Scope of B** (ContextRender A.4): system messages and the *current user message* (the latest
  user message) are separate model-input components and are not charged to B. Everything else
  (earlier user messages, assistant messages with their tool calls, tool results, placeholders)
  is. Tool schemas are not part of the stored history and are not counted.
* **Non-tool history is charged first** (A.4): the base cost is every retained user/assistant
  message plus, for each tool result, a short placeholder that names the result's id. Showing a
  result in full costs ``tok(result) − tok(placeholder)`` more. A call whose result is not shown
  therefore still gets an answer, so a provider never sees an orphaned call (our decision where
  the paper is silent; the placeholder is charged to B).
* **Retained non-tool history alone exceeds B**: the oldest units (an assistant message with its
  calls and results, or a user message) are dropped, each with a reason, until the base fits in
  half of B, leaving the other half for results; a dropped step comes back when a policy selects
  one of its results, and its assistant message is then charged too. The first user message,
  the current user message, system messages, the latest assistant message (the current turn,
  which may hold an in-flight call) and, when it opens with a thinking block, the first assistant
  message of the active tool loop with the user message that starts its exchange and the
  assistant message before that (:func:`loop_guard`) are protected. When even the
  protected part exceeds B, :class:`BudgetTooSmallError` says by how many tokens.
* **Provider order** (docs/architecture.md, invariant §5.2, §5.7): a rendering shows each tool result directly after the
  assistant message that made its call, even when another message (a user note, a summary) was
  stored between the call and its result; the interposed message follows the results
  (:func:`render_order`). Everything else stays chronological.
* **A late second result** for one call: both are stored; the latest is rendered (after its call),
  each earlier one is listed in ``dropped`` with its reason (``ContextGraph.superseded``).
* **Unanswered calls**: a call with no stored result that is not in the latest assistant message
  is answered by a synthetic result saying so; a call in the latest assistant message is in
  flight and is rendered without a result (docs/architecture.md, invariant §5.4).

Token counts are in tokens of the :class:`~historygraph.signals.tokens.TokenCounter` encoding.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import threading
import weakref
import re
from dataclasses import dataclass, field
from functools import cache, cached_property
from string import Formatter
from collections.abc import Mapping, Sequence, Set as AbstractSet
from typing import Any, Callable, Iterable, Iterator

import numpy as np

import msgspec

from historygraph.history.derived import DerivedKind, pack_array, snapshot_due, unpack_array
from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.signals.tokens import MESSAGE_OVERHEAD, TokenCounter

PLACEHOLDER = "[tool result {id} omitted from this context ({tokens} tokens); it is stored in full and can be restored by id]"
UNANSWERED = "[error: no result was recorded for tool call {id}]"
SEGMENT_JOIN = "\n[...]\n"  # between the shown pieces of a segmented assistant message (ReCAP ablations)
#: The text of an assistant message shown in brief view (its tool calls kept): what was left out and
#: where it is stored (its message number, as in :data:`DROPPED_MARK`).
BRIEF = "[text omitted ({tokens} tokens); stored in full, restore by message number #{position}]"
#: The dropped-step marker (docs/architecture.md, invariant §5.6): one per run of consecutive steps left out, where they
#: were, charged to B. It names the stored message numbers (positions in the session, ids the recall tool,
#: ``historygraph show --message`` and the session API take), the number of tool calls they hold and how
#: to get them back. Call ids are not listed: providers' ids are long (about 20 tokens each) and a
#: history over B may hold dozens of runs.
DROPPED_MARK = "[omitted: messages #{first}–#{last}, tool calls: {n}; stored in full, restore by message number]"
EXCERPT_MARK = "\n[... tool result {id} truncated: {kept} of {total} tokens shown (head and tail); the full result is stored and can be restored by id ...]\n"


class BudgetTooSmallError(ValueError):
    """The protected history alone exceeds the budget.

    Attributes:
        budget: the history budget B (tokens).
        required: tokens the protected history needs.
        shortfall: ``required − budget``.
    """

    def __init__(self, budget: int, required: int) -> None:
        self.budget, self.required, self.shortfall = budget, required, required - budget
        super().__init__(
            f"history budget {budget} tokens is {self.shortfall} tokens short: the protected history needs "
            f"{required} (what every rendering shows: the first user message and the latest assistant message, "
            f"and, where the history has them, the messages that open the active tool loop, their thinking "
            f"blocks and the markers of steps left out; system and current user messages are outside B); "
            f"use a budget of at least {required}")


class InvariantError(AssertionError):
    """A rendering broke one of the invariants of docs/architecture.md, invariant §5 (names which)."""


def render_order(graph: ContextGraph) -> list[int]:
    """Graph positions in the order a rendering shows them: chronological, except that the tool
    results of an assistant message follow it directly (in the order they arrived), so a message
    stored between a call and its result comes after the result (docs/architecture.md, invariant §5.3 exception, §5.7:
    both providers reject a request where anything sits between a call and its result)."""
    out: list[int] = []
    result_of = graph.result_of
    for p, m in enumerate(graph.messages):
        if m.role == "tool":
            continue
        out.append(p)
        calls = m.tool_calls
        if len(calls) == 1:  # the common case, without a sort
            r = result_of.get(calls[0].id)
            if r is not None:
                out.append(r)
        elif calls:
            out.extend(sorted(result_of[c.id] for c in calls if c.id in result_of))
    return out


def kept_render_order(graph: ContextGraph, counter: TokenCounter) -> list[int]:
    """:func:`render_order` read from the per-graph layout skeleton (extended on append, not
    rebuilt per call); a new list."""
    memo = _token_memo(graph, counter, placeholder_for)
    with memo._lock:
        memo._skeleton.update(graph, memo)
        return list(memo._skeleton.order)


def loop_opening(graph: ContextGraph) -> int | None:
    """Position of the assistant message that opens the active tool loop when it starts with a
    thinking block (it must then be rendered, byte-exact), else ``None``.

    Anthropic's rule (Messages API, "Extended thinking" with tool use): while a tool-use cycle is
    in progress, its first assistant message must be sent back starting with its ``thinking`` or
    ``redacted_thinking`` block, signature unmodified; otherwise the request is rejected
    ("a final assistant message must start with a thinking block"). The active loop is what
    follows the last user message that starts a new exchange: one neither stored between a call
    and its result nor following a tool result (or an assistant message with tool calls, whose
    results a rendering shows right after it) with only user messages between (on the wire such
    text shares the user turn of the results, which continues the loop). docs/architecture.md, invariant §5.7 protects that message like the
    latest assistant message; with no thinking block no provider requires it, and it is not."""
    return _loop_bounds(graph)[2]


def loop_guard(graph: ContextGraph, users: list[int] | None = None) -> tuple[int, ...]:
    """Positions every rendering must keep so that, on the wire, the active tool loop opens with
    its thinking block (docs/architecture.md, invariant §5.7): the user message that starts the
    loop's exchange, the assistant message before it (when there is one) and :func:`loop_opening`;
    empty when the loop opens without a thinking block.

    The provider finds the loop from the wire: it starts after the last user turn holding no tool
    result. Consecutive user messages merge into one turn, and a dropped-step marker or a summary
    is a user message, so if that assistant message were left out, the starting user message
    would share a turn with the tool results rendered before it, and the provider's loop would
    begin at an earlier assistant message, usually one without a thinking block; if the user
    message were left out without a marker (under a summary), the two assistant messages would
    merge into one turn that does not start with the thinking block.

    ``users``: the positions of the graph's user messages, ascending, when the caller has them
    (found by a scan otherwise)."""
    before, start, opening = _loop_bounds(graph, users)
    if opening is None:
        return ()
    return tuple(p for p in (before, start, opening) if p is not None)


def _loop_bounds(graph: ContextGraph, users: list[int] | None = None) -> tuple[int | None, int | None, int | None]:
    """``(assistant message before the user message that starts the active loop, that user
    message, loop_opening(graph))``, each ``None`` when there is none; ``users`` as for
    :func:`loop_guard`."""
    msgs = graph.messages
    start, before, user = 0, None, None
    if users is None:
        users = [p for p, m in enumerate(msgs) if m.role == "user"]
    for p in reversed(users):
        q = p - 1
        while q >= 0 and msgs[q].role == "user":  # consecutive user turns merge on the wire
            q -= 1
        if (q >= 0 and (msgs[q].role == "tool" or msgs[q].tool_calls)) or _between_call_and_result(graph, p):
            continue
        start, user, before = p + 1, p, (q if q >= 0 and msgs[q].role == "assistant" else None)
        break
    first = next((p for p in range(start, len(msgs)) if msgs[p].role == "assistant"), None)
    if first is None or not msgs[first].opens_with_thinking:
        return None, None, None
    return before, user, first


def _between_call_and_result(graph: ContextGraph, p: int) -> bool:
    """Whether position ``p`` lies strictly between a call and its (latest) result, looking at
    the shorter side of ``p``: the calls made before it, or the results stored after it."""
    msgs, result_of, owner = graph.messages, graph.result_of, graph.call_owner
    if p <= len(msgs) - p:
        return any(result_of.get(c.id, -1) > p for a in range(p) for c in msgs[a].tool_calls)
    return any(m.role == "tool" and result_of.get(m.tool_call_id or "") == r and owner[m.tool_call_id or ""] < p
               for r in range(p + 1, len(msgs)) for m in (msgs[r],))


@dataclass
class Rendering:
    """What a policy returns for one invocation.

    Attributes:
        messages: the model input, chronological: system messages, history, current user message.
        positions: for each rendered message, its graph position (``None`` for a synthetic result).
        full: positions of tool results rendered with their complete stored text.
        omitted: positions of tool results not rendered complete (placeholder, excerpt or dropped).
        dropped: positions of messages left out entirely.
        history_tokens: tokens charged to B.
        input_tokens: tokens of the whole rendered message list (history + system + current user).
        reasons: per-position explanation of the decision.
        stats: policy-specific numbers (e.g. model calls for summarising policies).
    """

    policy: str
    budget: int | None
    messages: list[Message]
    positions: list[int | None]
    full: list[int]
    omitted: list[int]
    dropped: list[int]
    history_tokens: int
    input_tokens: int
    reasons: dict[int, str] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)

    def to_openai(self) -> list[dict[str, Any]]:
        return [m.to_openai() for m in self.messages]

    def defer_reasons(self, build: Callable[[], dict[int, str]]) -> None:
        """Let :attr:`reasons` be built by ``build()`` when first read (an explanation per stored
        message is O(history) strings; a model call reads none of them). ``build`` must depend only
        on what it captured, so the dict it returns is the one an eager build would have given."""
        self.__dict__["_reasons_build"] = build

    def defer_positions(self, omitted: np.ndarray, dropped: np.ndarray) -> None:
        """Let :attr:`omitted` and :attr:`dropped` be the lists of these int arrays (ascending
        positions, owned by the rendering: nothing else may change them), made when first read: at
        1,000 results they are ~3,000 Python ints per render, which a model call does not read."""
        d = self.__dict__
        d["_omitted_build"], d["_dropped_build"] = omitted.tolist, dropped.tolist

    def __getstate__(self) -> dict[str, Any]:
        for name in _DEFERRED:  # materialise: the builders are closures and bound methods
            getattr(self, name)
        return self.__dict__


_DEFERRED = ("reasons", "omitted", "dropped")


def _deferred(name: str, doc: str) -> property:
    """A property over the dataclass field ``name`` whose value may be put off (``_<name>_build``:
    a callable giving it, called once, when first read); ``Rendering(name=…)``, assignment and
    equality work as for a plain field."""
    key, build_key = f"_{name}", f"_{name}_build"

    def get(self: Rendering) -> Any:
        d = self.__dict__
        build = d.get(build_key)
        if build is not None:  # idempotent: two threads reading at once build equal values
            d[key] = value = build()
            d.pop(build_key, None)
            return value
        return d[key]

    def put(self: Rendering, value: Any) -> None:
        self.__dict__.pop(build_key, None)
        self.__dict__[key] = value

    return property(get, put, doc=doc)


Rendering.reasons = _deferred("reasons", "per-position explanation of the decision")  # type: ignore[assignment]
Rendering.omitted = _deferred("omitted", "positions of tool results not rendered complete")  # type: ignore[assignment]
Rendering.dropped = _deferred("dropped", "positions of messages left out entirely")  # type: ignore[assignment]


def placeholder_for(message: Message, counter: TokenCounter) -> Message:
    text = PLACEHOLDER.format(id=message.tool_call_id, tokens=counter.count(message.content))
    return message.with_content(text, "placeholder")


def dropped_marker(graph: ContextGraph, steps: Sequence[Sequence[int]]) -> Message:
    """The marker standing for ``steps`` (consecutive steps left out, each a list of graph
    positions: a message and its results), a ``user`` message marked ``rendered_as="marker"``.
    Shared by every policy (:class:`Layout`, ReCAP). Its size is bounded: three numbers
    (:data:`DROPPED_MARK`)."""
    messages = map(graph.messages.__getitem__, map(operator.itemgetter(0), steps))  # each step's first message
    n_calls = sum(map(len, map(operator.attrgetter("tool_calls"), messages)))
    return _marker_message(min(map(min, steps)), max(map(max, steps)), n_calls)


def _marker_message(first: int, last: int, n_calls: int) -> Message:
    """:func:`dropped_marker` from its numbers (the text :func:`_marker_parts` joins)."""
    return Message("user", DROPPED_MARK.format(first=first, last=last, n=n_calls), rendered_as="marker")


_FIELDS = Formatter()


def _marker_parts(first: int, last: int, n_calls: int) -> list[tuple[str | None, str]]:
    """The marker's text as ``(slot, text)`` parts, in order: slot ``None`` for fixed wording,
    ``"first"``, ``"last"`` and ``"n"`` for its numbers. :class:`_MarkerPlan` counts a marker from them."""
    values = {"first": first, "last": last, "n": n_calls}
    out: list[tuple[str | None, str]] = []
    for literal, name, spec, conversion in _FIELDS.parse(DROPPED_MARK):
        if literal:
            out.append((None, literal))
        if name is not None:
            out.append((name, _FIELDS.format_field(_FIELDS.convert_field(values[name], conversion), spec or "")))
    return out


_SLOT_COUNTS: dict[tuple, list[dict[str, int]]] = {}  # (encoding, wording, slots) -> per-slot value counts
_SLOT_TABLES: dict[tuple, dict[str, np.ndarray]] = {}  # the same as per-slot tables of :meth:`_MarkerPlan.gather`
_UNKNOWN = np.iinfo(np.int64).min  # a table entry of _MarkerPlan.gather not computed yet


class _MarkerPlan:
    """Exact token counts of dropped-step markers from per-slot counts instead of encoding each
    marker (selection prices thousands of markers per render, each a new text).

    The marker's fixed wording is cut into pieces at every
    :func:`~historygraph.signals.tokens.forced_boundary`; a slot's value (one of its numbers) forms
    one chunk with the pieces next to it that it is not forcibly separated from. Then
    ``tokens = MESSAGE_OVERHEAD + Σ tokens(fixed pieces) + Σ_slots (tokens(chunk) − tokens(the
    pieces it took))``, exact because every chunk and piece is bounded by forced boundaries. The
    slot counts are memoised per value. When the wording leaves two slots in one chunk (no forced
    boundary between them) no plan is built (:meth:`build` returns ``None``) and markers are counted
    whole."""

    SLOTS = ("first", "last", "n")

    def __init__(self, counter: TokenCounter, literals: list[str], slots: list[str]) -> None:
        from historygraph.signals.tokens import boundary_pieces
        self.counter, self.slots = counter, slots
        self.pieces = [boundary_pieces(lit) if lit else [] for lit in literals]  # literals[j] precedes slots[j]
        self.const = MESSAGE_OVERHEAD + sum(counter.count(p) for ps in self.pieces for p in ps)
        self.index = {name: j for j, name in enumerate(slots)}
        # slot counts depend on the encoding and the wording only: shared by every graph's plan
        key = (counter.encoding_name, tuple(literals), tuple(slots))
        self.memo: list[dict[str, int]] = _SLOT_COUNTS.setdefault(key, [{} for _ in slots])
        # (a race between threads only recomputes an entry: every value written is the same)
        self._tables: dict[str, np.ndarray] = _SLOT_TABLES.setdefault(key, {})
        # the fewest tokens any marker can have: a slot's chunk is never empty, so it counts at
        # least 1, less the pieces next to it that a number may take
        self.floor = self.const + sum(1 - self._took_at_most(j) for j in range(len(slots)))

    def _took_at_most(self, j: int) -> int:
        """The most tokens of fixed pieces that slot ``j``'s chunk can take (see :meth:`delta`), over
        numbers' first and last digits."""
        from historygraph.signals.tokens import forced_boundary
        before, after = self.pieces[j], self.pieces[j + 1]
        took = 0
        if before and not all(forced_boundary(before[-1][-1], d) for d in "0123456789"):
            took += self.counter.count(before[-1])
        if after and not all(forced_boundary(d, after[0][0]) for d in "0123456789"):
            took += self.counter.count(after[0])
        return took

    def tokens(self, first: int, last: int, n_calls: int) -> int:
        """Tokens of the marker for a run from position ``first`` to position ``last`` holding
        ``n_calls`` tool calls."""
        return self.const + self.number("first", first) + self.number("last", last) + self.number("n", n_calls)

    def number(self, slot: str, value: int) -> int:
        """Delta of the number slot ``slot`` (one of :attr:`SLOTS`) holding ``value``."""
        return self.delta(self.index[slot], str(value))

    def gather(self, slot: str, values: np.ndarray) -> np.ndarray:
        """``[number(slot, v) for v in values]`` (int64), from a table per slot indexed by the
        value, filled as values first appear (shared by every plan of the encoding and wording)."""
        table = self._tables.get(slot)
        top = int(values.max()) + 1 if len(values) else 0
        if table is None or len(table) < top:
            grown = np.full(max(top, 2 * len(table) if table is not None else top), _UNKNOWN, dtype=np.int64)
            if table is not None:
                grown[:len(table)] = table
            table = self._tables[slot] = grown
        out = table[values]
        missing = (out == _UNKNOWN).nonzero()[0]  # (the method: np.flatnonzero's wrappers cost more than the work here)
        if len(missing):  # each new value counted once: a run's suffix maxima repeat one value over most of it
            for v in set(values[missing].tolist()):
                table[v] = self.number(slot, v)
            out = table[values]
        return out

    @classmethod
    def build(cls, counter: TokenCounter) -> "_MarkerPlan | None":
        if not counter.splits_exactly:
            return None
        literals, slots, text = [], [], ""
        for slot, t in _marker_parts(0, 0, 0):
            if slot is None:
                text += t
            else:
                literals.append(text)
                slots.append(slot)
                text = ""
        literals.append(text)
        if sorted(slots) != sorted(cls.SLOTS):
            return None
        plan = cls(counter, literals, slots)
        return plan if all(plan._separates(j) for j in range(1, len(slots))) else None

    def _separates(self, j: int) -> bool:
        """Whether the fixed text before slot ``j`` keeps slots ``j − 1`` and ``j`` in different
        chunks for every value (a number has digits at both ends)."""
        from historygraph.signals.tokens import forced_boundary
        ps = self.pieces[j]
        if not ps:  # numbers side by side: their meeting must be a forced boundary
            return forced_boundary("0", "0")
        if len(ps) >= 2:
            return True
        return forced_boundary("0", ps[0][0]) or forced_boundary(ps[0][-1], "0")

    def delta(self, j: int, value: str) -> int:
        """Tokens slot ``j`` adds with ``value``: its chunk's count minus the pieces it took."""
        n = self.memo[j].get(value)
        if n is None:
            from historygraph.signals.tokens import forced_boundary
            chunk, took = value, 0
            before, after = self.pieces[j], self.pieces[j + 1]
            if before and not forced_boundary(before[-1][-1], value[0]):
                chunk = before[-1] + chunk
                took += self.counter.count(before[-1])
            if after and not forced_boundary(value[-1], after[0][0]):
                chunk += after[0]
                took += self.counter.count(after[0])
            if len(self.memo[j]) >= 100_000:  # bounded, like the counter's own memo
                self.memo[j].clear()
            n = self.memo[j][value] = self.counter.count(chunk) - took
        return n


_PLANS: dict[tuple[type, str, str], "_MarkerPlan | None"] = {}


def _marker_plan(counter: TokenCounter) -> "_MarkerPlan | None":
    """:meth:`_MarkerPlan.build` for ``counter``, one per counter type, encoding and marker wording
    (what the plan counts depends on those alone, as for :class:`_TokenMemo`), shared by every graph."""
    key = (type(counter), counter.encoding_name, DROPPED_MARK)
    if key not in _PLANS:
        _PLANS[key] = _MarkerPlan.build(counter)
    return _PLANS[key]


_excerpts: dict[tuple[str, int, str | None, int], Message] = {}


def excerpt_for(message: Message, max_tokens: int, counter: TokenCounter) -> Message:
    """Head-and-tail truncation of a tool result to at most ``max_tokens`` tokens (whole message,
    overhead included). The marker in the middle says it is truncated and names the result id
    (ContextRender A.4 oversized-result fallback when no LLM is configured). When ``max_tokens``
    cannot hold the marker and some of the text, the result's placeholder is returned instead
    (``rendered_as="placeholder"``). The stored original is unchanged. Excerpts are memoised per
    (encoding, size, id, content hash)."""
    key = (counter.encoding_name, max_tokens, message.tool_call_id, hash(message.content))
    hit = _excerpts.get(key)
    if hit is None:
        overhead = counter.count_message(message.with_content("", "excerpt"))
        hit = _make_excerpt(message, max_tokens - overhead, counter)
        if len(_excerpts) > 256:
            _excerpts.clear()
        _excerpts[key] = hit
    return hit


def oversized_excerpt(message: Message, cost: int, budget: int | None, counter: TokenCounter,
                      excerpt_fraction: float = 0.25) -> Message | None:
    """The stand-in of a tool result whose own ``cost`` (tokens) exceeds ``budget``: its marked
    head-and-tail excerpt of ``excerpt_fraction·budget`` tokens (at least 16); ``None`` when the
    result fits. The oversized-result fallback every policy shares (ContextRender A.4, no LLM)."""
    if budget is None or cost <= budget:
        return None
    return excerpt_for(message, max(16, int(excerpt_fraction * budget)), counter)


def _make_excerpt(message: Message, max_tokens: int, counter: TokenCounter) -> Message:
    total = counter.count(message.content)
    mark_cost = counter.count(EXCERPT_MARK.format(id=message.tool_call_id, kept=total, total=total)) + 2
    keep = max(0, max_tokens - mark_cost)
    head = counter.truncate(message.content, keep - keep // 3)
    tail = counter.tail(message.content, keep // 3)
    text = head + EXCERPT_MARK.format(id=message.tool_call_id, kept=counter.count(head) + counter.count(tail), total=total) + tail
    while counter.count(text) > max_tokens and keep > 0:  # re-tokenising at the seams can add a token or two
        keep = max(0, keep - max(4, keep // 20))
        head = counter.truncate(message.content, keep - keep // 3)
        tail = counter.tail(message.content, keep // 3)
        text = head + EXCERPT_MARK.format(id=message.tool_call_id, kept=counter.count(head) + counter.count(tail), total=total) + tail
    if not (head or tail) or counter.count(text) > max_tokens:  # no room to show anything: say so, never "0 of N shown"
        return placeholder_for(message, counter)
    return message.with_content(text, "excerpt")


class _Grow:
    """An int64 array grown by appending (amortised O(1)) and cut back by :meth:`truncate`.
    :meth:`view` hands out a view of the filled part; a truncation first copies the buffer, so a
    view handed out earlier keeps its values (a render may still be reading it)."""

    __slots__ = ("buf", "n", "pending")

    def __init__(self, values: Iterable[int] | np.ndarray = (), collect: bool = False) -> None:
        vals = values if isinstance(values, np.ndarray) else list(values)
        self.buf = np.zeros(max(64, 2 * len(vals)), dtype=np.int64)
        self.buf[:len(vals)] = vals
        self.n = len(vals)
        # with ``collect``, appends go to a list until :meth:`flush` (a build from scratch appends thousands)
        self.pending: list[int] | None = [] if collect else None

    def flush(self) -> None:
        if self.pending is not None:
            vals, self.pending = self.pending, None
            grown = _Grow(self.buf[:self.n].tolist() + vals)
            self.buf, self.n = grown.buf, grown.n

    def append(self, value: int) -> None:
        if self.pending is not None:
            self.pending.append(value)
            return
        if self.n == len(self.buf):
            grown = np.zeros(2 * len(self.buf), dtype=np.int64)
            grown[:self.n] = self.buf
            self.buf = grown
        self.buf[self.n] = value
        self.n += 1

    def extend(self, values: list[int]) -> None:
        if self.pending is not None:
            self.pending.extend(values)
            return
        if self.n + len(values) > len(self.buf):
            grown = np.zeros(max(2 * len(self.buf), 2 * (self.n + len(values))), dtype=np.int64)
            grown[:self.n] = self.buf[:self.n]
            self.buf = grown
        self.buf[self.n:self.n + len(values)] = values
        self.n += len(values)

    def truncate(self, n: int) -> None:
        if n < self.n:
            self.buf = self.buf.copy()
            self.n = n

    def view(self) -> np.ndarray:
        return self.buf[:self.n]


class _Placeholders(dict[int, Message]):
    """The placeholder of each tool result of one graph by position, built on first use (a render
    shows only a few of them; a reopened session's counts come from its derived rows without
    building any). Only ever added to, so snapshots share it uncopied."""

    def __init__(self, counter: TokenCounter, build: Callable[[Message, TokenCounter], Message]) -> None:
        super().__init__()
        self.counter, self.build = counter, build
        self.messages: list[Message] = []

    def __missing__(self, p: int) -> Message:
        m = self.messages[p] if 0 <= p < len(self.messages) else None
        if m is None or m.role != "tool":
            raise KeyError(p)
        return self.setdefault(p, self.build(m, self.counter))

    def get(self, p: int, default: Any = None) -> Any:
        try:
            return self[p]
        except KeyError:
            return default


@cache
def token_rows(stock: bool, encoding: str, build: Callable[[Message, TokenCounter], Message]) -> DerivedKind | None:
    """The derived rows (:mod:`historygraph.history.derived`) of :class:`_TokenMemo`'s per-message counts:
    one per position, ``count_message`` of the message, and for a tool result ``[its count, its
    placeholder's count]``. Named for the encoding and the placeholder builder, so another
    encoding or builder never reads them; versioned by the source of the modules that compute
    them. ``stock``: the counter is a plain :class:`TokenCounter`. ``None`` (nothing kept) for
    another counter (a subclass may count differently) or a
    builder that is not a module-level function (a closure's output is not a function of the
    message alone)."""
    name = getattr(build, "__qualname__", "<none>")
    module = getattr(build, "__module__", None)
    if not stock or "<" in name or not isinstance(module, str):
        return None
    return DerivedKind(f"render.tokens:{encoding}:{module}.{name}",
                       tuple(dict.fromkeys(("historygraph.render", "historygraph.history.events", "historygraph.signals.tokens",
                                            "tiktoken.core", module))))


@cache
def token_snapshot(rows: DerivedKind) -> DerivedKind:
    """The per-graph snapshot of :class:`_TokenMemo` beside its per-message rows ``rows``
    (:func:`token_rows`): one row at position 0 holding, at a known number of messages ``upto``,
    every message's count and every tool result's position, count and placeholder count as
    arrays (:func:`~historygraph.history.derived.pack_array`), so that a reopened session reads one row
    instead of decoding one per message. Put when the graph has grown by a quarter since the last
    one read or put (:func:`~historygraph.history.derived.snapshot_due`); versioned as ``rows`` and by
    the packing (``historygraph.history.derived``)."""
    return DerivedKind(rows.name.replace("render.tokens:", "render.memo:", 1), rows.modules + ("historygraph.history.derived",))


def _tool_positions(graph: ContextGraph) -> np.ndarray:
    """Positions of every tool result of ``graph``, ascending (int64): the latest result of each
    call and every superseded one, the keys of ``owner_of`` (no pass over the messages)."""
    a = np.fromiter(graph.owner_of, dtype=np.int64, count=len(graph.owner_of))
    a.sort()  # (filled in position order: already sorted)
    return a


class _TokenMemo:
    """What :class:`Layout` needs per message of one graph, computed once and kept across renders
    (the graph is append-only, so position ``p`` always holds the same message): the token count
    of every message, and for every tool result its placeholder (built when first asked for) and
    the placeholder's count. One memo per graph, counter type + encoding and placeholder builder;
    filled up to the graph's length on each use, under a lock (the proxy renders in worker
    threads). The counts of a graph from a store are read from and kept as its derived rows
    (:func:`token_rows`)."""

    def __init__(self, counter: TokenCounter, placeholder: Callable[[Message, TokenCounter], Message]) -> None:
        self.counter, self.build = counter, placeholder
        self.tokens: list[int] = []                              # count_message(messages[p])
        # per result its placeholder, only ever added to, so layouts share it uncopied
        self.ph_message = _Placeholders(counter, placeholder)
        self.tools = _Grow()                                     # positions of the tool results, ascending
        self.tools_ph = _Grow()                                  # the placeholder's count of each of them, in that order
        # result_tokens and ph_tokens as dicts, built when first read
        self._result_tokens: dict[int, int] | None = None
        self._ph_tokens: dict[int, int] | None = None
        self.marker_plan = _marker_plan(counter)
        self.kind = token_rows(type(counter) is TokenCounter, counter.encoding_name, placeholder)
        self._skeleton = _Skeleton()
        self._lock = threading.Lock()
        # (graph length, loop_guard of the graph at that length): the graph is append-only
        self.guard: tuple[int, tuple[int, ...]] | None = None
        self.kept = 0  # messages of the last snapshot read or put (token_snapshot)
        self.one_by_one = False  # started from a snapshot: read the later rows one at a time
        self._tokens_array = np.zeros(0, dtype=np.int64)  # tokens_array()
        # Layout._remove_deltas of runs of dropped steps, by (skeleton build, first, last unit), kept
        # across renders: a run's marker costs depend only on its units' facts, which no longer change
        # once a later unit exists (a change to an earlier unit rebuilds the skeleton: a new build)
        self.run_deltas: dict[tuple[int, int, int], np.ndarray] = {}

    def skeleton(self, graph: ContextGraph, budget: int | None = None) -> dict[str, Any]:
        """A snapshot of the graph's :class:`_Skeleton`, taken under the lock (another thread may
        extend it meanwhile): copies of its lists a layout iterates or changes; its dicts, sets and
        per-unit facts themselves (:meth:`_Skeleton.lend`: what is lent is only ever added to, so
        a snapshot reads what it read when taken). ``over``: the candidates whose full cost exceeds
        ``budget``, ascending."""
        with self._lock:
            sk = self._skeleton
            sk.update(graph, self)
            over = sk.over(budget, self.tokens_array()) if budget is not None else []
            sk.lend()
            return {"users": sk.users, "current_user": sk.current_user, "first_user": sk.first_user, "last_assistant": sk.last_assistant,
                    "outside": sk.outside, "order": list(sk.order), "units": sk.units.view(),
                    "build": sk.builds, "synthetic": sk.synthetic,
                    "placeholder": self.ph_message, "candidates": list(sk.candidates),
                    "over": over, "glue": list(sk.glue), "breaks": sk.breaks, "facts": (sk.lo, sk.hi, sk.top, sk.ncalls, sk.pre),
                    "full_tokens": sk.full_tokens, "total_cost": sk.total_cost,
                    "starts": list(sk.starts),
                    "arrays": sk.arrays()}

    def candidate_maps(self, build: int) -> tuple[dict[int, int], dict[int, Message], dict[int, int]] | None:
        """The skeleton's candidate dicts (:meth:`_Skeleton.maps`, built now if they were not),
        lent as a snapshot's are, when the skeleton is still of build ``build`` (a later state of
        it only added candidates, with the same values); None when it was rebuilt since."""
        with self._lock:
            sk = self._skeleton
            if sk.builds != build:
                return None
            maps = sk.maps()
            sk.lend()
            return maps

    @property
    def result_tokens(self) -> dict[int, int]:
        """Every tool result's count by position (its entry of :attr:`tokens`), a dict built when
        first read, then kept and only ever added to (layouts share it uncopied)."""
        with self._lock:
            if self._result_tokens is None:
                t = self.tools.view()
                self._result_tokens = dict(zip(t.tolist(), self.tokens_array()[t].tolist()))
            return self._result_tokens

    @property
    def ph_tokens(self) -> dict[int, int]:
        """Every tool result's placeholder count by position (:attr:`tools_ph`), a dict built when
        first read, then kept as :attr:`result_tokens`."""
        with self._lock:
            if self._ph_tokens is None:
                self._ph_tokens = dict(zip(self.tools.view().tolist(), self.tools_ph.view().tolist()))
            return self._ph_tokens

    def ph_count(self, p: int) -> int:
        """The placeholder count of tool result ``p`` (from the arrays: callable under the lock)."""
        return int(self.tools_ph.view()[int(self.tools.view().searchsorted(p))])

    def tokens_array(self) -> np.ndarray:
        """:attr:`tokens` as an int64 array (kept, extended when the memo has grown)."""
        a = self._tokens_array
        if len(a) != len(self.tokens):
            a = self._tokens_array = np.concatenate([a[:len(self.tokens)], np.asarray(self.tokens[len(a):], dtype=np.int64)]) \
                if len(a) < len(self.tokens) else np.asarray(self.tokens, dtype=np.int64)
        return a

    def _restore(self, graph: ContextGraph, data: Any) -> bool:
        """Start from the stored snapshot ``data`` (:func:`token_snapshot`) when it is one of this
        graph: taken at no more messages than it holds, with exactly the graph's tool results
        among them, one count per message and two per result (the first the message's count)."""
        try:
            upto = data["upto"]
            tools, tokens, rtok, ptok = (unpack_array(data[k]) for k in ("tools", "tokens", "result", "placeholder"))
        except (TypeError, KeyError, ValueError):
            return False
        if type(upto) is not int or not 0 < upto <= len(graph.messages) or tokens.shape != (upto,) \
                or not (tools.ndim == rtok.ndim == ptok.ndim == 1) or not (len(tools) == len(rtok) == len(ptok)) \
                or tokens.dtype.kind != "i" or tools.dtype.kind != "i" or rtok.dtype.kind != "i" or ptok.dtype.kind != "i":
            return False
        have = _tool_positions(graph)
        have = have[:int(np.searchsorted(have, upto))]
        if not np.array_equal(have, tools) or not np.array_equal(tokens[tools], rtok):
            return False
        self.tokens = tokens.tolist()
        self._tokens_array = tokens.astype(np.int64)
        self.tools = _Grow(tools.astype(np.int64))
        self.tools_ph = _Grow(ptok.astype(np.int64))
        self._result_tokens = self._ph_tokens = None  # (built again when read)
        self.kept = upto
        return True

    def _keep(self, graph: ContextGraph) -> None:
        """Put the snapshot (:func:`token_snapshot`) when the graph has grown by a quarter since the last one."""
        n = len(self.tokens)
        if self.kind is None or not graph.derived.persist or not snapshot_due(n, self.kept):
            return
        tools, tokens = self.tools.view(), self.tokens_array()
        data = {"upto": n, "tools": pack_array(tools), "tokens": pack_array(tokens),
                "result": pack_array(tokens[tools]), "placeholder": pack_array(self.tools_ph.view())}
        graph.derived.put_json(token_snapshot(self.kind), 0, msgspec.json.encode(data).decode())
        self.kept = n

    def update(self, graph: ContextGraph) -> None:
        messages = graph.messages
        if len(self.tokens) == len(messages):
            return
        with self._lock:
            self.ph_message.messages = messages
            derived = graph.derived
            kind = self.kind if derived.persist else None
            stored: dict[int, Any] = {}
            if kind is not None:
                if not self.tokens and self._restore(graph, derived.take_value(token_snapshot(kind), 0)):
                    self.one_by_one = True
                # after a snapshot, the rows of the messages added since, one by one (not the whole table decoded)
                stored = _RowsAfter(derived, kind) if self.one_by_one else derived.table(kind)
            count, build = self.counter.count_message, self.build
            tokens, result_tokens, ph_tokens = self.tokens, self._result_tokens, self._ph_tokens
            tools: list[int] = []
            tools_ph: list[int] = []
            pop = stored.pop
            try:
                for p in range(len(tokens), len(messages)):
                    m = messages[p]
                    v = pop(p, None)
                    if m.role == "tool":
                        if type(v) is list and len(v) == 2:
                            n, k = v
                        else:
                            n = count(m)
                            ph = self.ph_message[p] = build(m, self.counter)
                            k = count(ph)
                            if kind is not None:
                                derived.put(kind, p, [n, k])
                        if result_tokens is not None:
                            result_tokens[p] = n
                        if ph_tokens is not None:
                            ph_tokens[p] = k
                        tools.append(p)
                        tools_ph.append(k)
                    elif type(v) is int:
                        n = v
                    else:
                        n = count(m)
                        if kind is not None:
                            derived.put(kind, p, n)
                    tokens.append(n)
            finally:  # (what was counted, even when counting a later message failed)
                self.tools.extend(tools)
                self.tools_ph.extend(tools_ph)
            self._keep(graph)


class _RowsAfter(dict):
    """``pop(position, default)`` of a kind's stored rows read one at a time
    (:meth:`~historygraph.history.derived.Derived.take_value`): after a snapshot, only the rows of the
    messages added since are read, not the whole table decoded."""

    def __init__(self, derived: Any, kind: DerivedKind) -> None:
        super().__init__()
        self.derived, self.kind = derived, kind

    def pop(self, position: int, default: Any = None) -> Any:
        v = self.derived.take_value(self.kind, position)
        return default if v is None else v


class _Skeleton:
    """The part of a :class:`Layout` that depends on the graph alone (render order, units with
    their costs, placeholders, synthetic answers, glue without inserts), kept per graph and
    extended when the graph grows by steps of the current tool loop: the last unit is rebuilt
    with the new messages (kept as it is when none of them belong to it). Anything else (a user
    or system message, a result for an earlier step, a superseding result) rebuilds it from
    scratch."""

    def __init__(self) -> None:
        self.n = -1
        self.superseded = -1
        self._lent = False
        self.builds = 0  # how many times built from scratch (a snapshot names the build it was taken of)
        # candidate -> its unit, complete message and delta, as dicts: built from the candidate
        # arrays when first read (:meth:`maps`), then kept up to date; until then the arrays are
        # the only record (a reopened session's first render of a policy that reads no dict, such
        # as prune, builds none)
        self._maps: tuple[dict[int, int], dict[int, Message], dict[int, int]] | None = None

    def update(self, graph: ContextGraph, memo: "_TokenMemo") -> None:
        if self.n == len(graph.messages) and self.superseded == len(graph.superseded):
            return
        if not self._extend(graph, memo):
            self._build(graph, memo)
        self.n, self.superseded = len(graph.messages), len(graph.superseded)

    def _build(self, graph: ContextGraph, memo: "_TokenMemo") -> None:
        # From whole-graph arrays, not per message: a reopened session's first render builds the
        # skeleton over its whole history (thousands of units). Each unit is a user or assistant
        # message not outside B (only assistant messages carry calls, and every result's call
        # comes before it), followed in the order by its calls' latest results, ascending; what
        # :meth:`_add` does per message when the graph is extended.
        msgs = graph.messages
        n = len(msgs)
        self._lent = False  # every container is a new one
        i64 = np.int64
        # roles from the graph's own maps (no pass over every message): a message with calls is an
        # assistant message (``call_owner``: its position per call), a tool result is a latest or a
        # superseded result (the memo's positions of the results); only the rest (user and system
        # messages, assistant messages without calls) are read
        tools_at = memo.tools.view()
        is_tool = np.zeros(n, dtype=bool)
        is_tool[tools_at] = True
        owners = graph.call_owner
        calls_at = np.bincount(np.fromiter(owners.values(), dtype=i64, count=len(owners)), minlength=n)  # calls per position
        has_calls = calls_at > 0
        rest = (~(has_calls | is_tool)).nonzero()[0].tolist()
        rest_roles = [msgs[p].role for p in rest]
        users = self.users = [p for p, r in zip(rest, rest_roles) if r == "user"]  # (extending adds none)
        self.current_user = users[-1] if users else None
        self.first_user = users[0] if users else None
        with_calls = has_calls.nonzero()[0]
        last = max(int(with_calls[-1]) if len(with_calls) else -1,
                   next((p for p, r in zip(reversed(rest), reversed(rest_roles)) if r == "assistant"), -1))
        self.last_assistant = last if last >= 0 else None
        self.outside = {p for p, r in zip(rest, rest_roles) if r == "system"}
        if self.current_user is not None:
            self.outside.add(self.current_user)
        outside = self.outside
        nt = (~is_tool).nonzero()[0]
        in_b = ~is_tool
        if outside:
            in_b[list(outside)] = False
        lo = in_b.nonzero()[0]
        unit_pos = lo.tolist()
        n_units = len(unit_pos)
        uidx = np.full(n, -1, dtype=i64)  # position -> its unit (a unit's message), −1 otherwise
        uidx[lo] = np.arange(n_units, dtype=i64)
        result_of = graph.result_of
        # every result's call owner, by position (``owner_of`` is filled in position order, as the
        # memo's positions are), and the latest results: those not superseded, ascending
        rpos = tools_at
        rown = np.fromiter(graph.owner_of.values(), dtype=i64, count=len(tools_at))
        if graph.superseded:
            latest = ~np.isin(tools_at, np.fromiter(graph.superseded, dtype=i64, count=len(graph.superseded)))
            rpos, rown = rpos[latest], rown[latest]
        by_owner = np.argsort(rown, kind="stable")  # results grouped by their unit, ascending within it
        rpos, rown = rpos[by_owner], rown[by_owner]
        runit = uidx[rown]
        # the order: every non-tool message, each followed by its results
        head = np.concatenate([nt, rown])
        perm = np.lexsort((np.concatenate([np.full(len(nt), -1, dtype=i64), rpos]), head))
        order = np.concatenate([nt, rpos])[perm]
        entry_unit = uidx[head[perm]]
        starts = np.flatnonzero(perm < len(nt))[uidx[nt] >= 0]  # where each unit's message is in the order
        tokens = memo.tokens_array()
        rph = memo.tools_ph.view()[np.searchsorted(tools_at, rpos)]  # (every result is among the memo's)
        rtok = tokens[rpos]
        answered = np.bincount(runit, minlength=n_units)
        ncalls_a = calls_at[lo]  # (a user message has none)
        # synthetic answers for the calls without a result (only the very last message can be in flight)
        self.synthetic: dict[int, list[Message]] = {}
        synthetic_of = self.synthetic
        syn_tokens = np.zeros(n_units, dtype=i64)
        count_message = memo.counter.count_message
        for i in np.flatnonzero(ncalls_a > answered).tolist():
            p = unit_pos[i]
            if p == n - 1:
                continue
            synthetic = [Message(role="tool", content=UNANSWERED.format(id=call.id), tool_call_id=call.id,
                                 rendered_as="placeholder") for call in msgs[p].tool_calls if call.id not in result_of]
            synthetic_of[p] = synthetic
            syn_tokens[i] = sum(count_message(x) for x in synthetic)
        own = tokens[lo] + syn_tokens
        # (float sums of integers: exact below 2**53)
        cost = own + np.bincount(runit, weights=rph, minlength=n_units).astype(i64)
        full = own + np.bincount(runit, weights=rtok, minlength=n_units).astype(i64)
        hi = lo.copy()  # a unit's message comes before its results
        np.maximum.at(hi, runit, rpos)
        if n_units:
            earlier = np.concatenate([[np.iinfo(i64).min], np.maximum.accumulate(hi)[:-1]])
            top = np.maximum.accumulate(np.where(hi >= earlier, np.arange(n_units, dtype=i64), 0))
        else:
            top = np.zeros(0, dtype=i64)
        is_unit = uidx[nt] >= 0
        glue = np.concatenate([[False], is_unit[:-1]])[is_unit] if len(nt) else np.zeros(0, dtype=bool)
        pre = np.concatenate([[0], np.cumsum(ncalls_a)]).astype(i64)
        order_l, starts_l, sizes = order.tolist(), starts.tolist(), (answered + 1).tolist()
        self.order = order_l
        self.units = _Units(order_l, starts_l, sizes, cost.tolist())  # each _Unit built when first read
        self.starts = starts_l                 # index in order where each unit's message is
        self.fulls = full.tolist()             # each unit's tokens when complete
        cand_order = np.argsort(rpos, kind="stable")
        cands, cand_units = rpos[cand_order], runit[cand_order]
        cand_delta = (rtok - rph)[cand_order]
        self.candidates = cands.tolist()
        self._msgs, self._maps = msgs, None
        self.builds += 1
        self.glue = glue.tolist()
        self.breaks = (~glue).nonzero()[0].tolist()  # the units whose glue is False, ascending
        self.full_tokens, self.total_cost = int(full.sum()), int(cost.sum())
        # Layout._unit_facts per unit: lowest and highest position, prefix-max holder, calls, prefix sums
        self.lo, self.hi, self.top, self.ncalls, self.pre = unit_pos, hi.tolist(), top.tolist(), ncalls_a.tolist(), pre.tolist()
        self.cand_stale = False  # a candidate was inserted before the last one: rebuild the candidate arrays
        # the same as arrays (see :meth:`arrays`): per order entry its position and unit (−1 outside B),
        # per unit its cost, lowest and highest position and the prefix sums of calls, per candidate
        # (ascending) its position, delta and unit
        self.g_order, self.g_entry_unit, self.g_cost = _Grow(order), _Grow(entry_unit), _Grow(cost)
        self.g_lo, self.g_hi, self.g_pre = _Grow(lo), _Grow(hi), _Grow(pre)
        self.g_cand_pos, self.g_cand_delta, self.g_cand_unit = _Grow(cands), _Grow(cand_delta), _Grow(cand_units)

    def _add(self, p: int, graph: ContextGraph, memo: "_TokenMemo", glue: bool) -> bool:
        """Append message ``p`` (not a tool result, not outside B) to the order, as a unit when it is
        a user or assistant message (the unit-building rules of :class:`Layout`)."""
        msgs = graph.messages
        m = msgs[p]
        start = len(self.order)
        self.order.append(p)
        results = sorted(graph.result_of[c.id] for c in m.tool_calls if c.id in graph.result_of)
        self.order.extend(results)
        unit_role = m.role in ("user", "assistant")
        i = len(self.units)
        for q in (p, *results):
            self.g_order.append(q)
            self.g_entry_unit.append(i if unit_role else -1)
        if not unit_role:
            return False
        unit = _Unit([p], protected=False)
        synthetic = []
        if m.role == "assistant":
            for call in m.tool_calls:
                if call.id not in graph.result_of and p != len(msgs) - 1:  # only the very last message can be in flight
                    synthetic.append(Message(role="tool", content=UNANSWERED.format(id=call.id), tool_call_id=call.id,
                                             rendered_as="placeholder"))
            unit.positions += results
        if synthetic:
            self.synthetic[p] = synthetic
        full = memo.tokens[p] + sum(memo.counter.count_message(x) for x in synthetic)
        unit.cost = full
        for r in unit.positions[1:]:
            ph_tokens = memo.ph_count(r)
            unit.cost += ph_tokens
            full += memo.tokens[r]
            delta = memo.tokens[r] - ph_tokens
            if self.candidates and r < self.candidates[-1]:
                self.maps()  # the arrays fall behind: from now on the dicts are the record
                self.cand_stale = True
            elif not self.cand_stale:
                self.g_cand_pos.append(r)
                self.g_cand_delta.append(delta)
                self.g_cand_unit.append(i)
            if self._maps is not None:
                unit_of, form, deltas = self._maps
                unit_of[r], form[r], deltas[r] = i, msgs[r], delta
            bisect.insort(self.candidates, r)
        self.units.append(unit)
        self.starts.append(start)
        self.fulls.append(full)
        self.glue.append(glue)
        if not glue:
            self.breaks.append(i)
        self.full_tokens += full
        self.total_cost += unit.cost
        self.lo.append(p)  # a unit's message comes before its results
        self.hi.append(unit.positions[-1] if len(unit.positions) > 1 else p)
        self.top.append(i if not self.top or self.hi[-1] >= self.hi[self.top[-1]] else self.top[-1])
        self.ncalls.append(len(m.tool_calls) if m.role == "assistant" else 0)
        self.pre.append(self.pre[-1] + self.ncalls[-1])
        self.g_cost.append(unit.cost)
        self.g_lo.append(self.lo[-1])
        self.g_hi.append(self.hi[-1])
        self.g_pre.append(self.pre[-1])
        return True

    def over(self, budget: int, tokens: np.ndarray) -> list[int]:
        """The candidates whose full cost (``tokens``: every message's, by position) exceeds
        ``budget``, ascending."""
        self._fresh_candidates()
        pos = self.g_cand_pos.view()
        return pos[tokens[pos] > budget].tolist()

    def _fresh_candidates(self) -> None:
        """Rebuild the candidate arrays when a candidate was inserted before the last one."""
        if self.cand_stale:
            assert self._maps is not None  # (built before the arrays fell behind)
            unit_of, _, delta = self._maps
            self.g_cand_pos = _Grow(self.candidates)
            self.g_cand_delta = _Grow(delta[p] for p in self.candidates)
            self.g_cand_unit = _Grow(unit_of[p] for p in self.candidates)
            self.cand_stale = False

    def maps(self) -> tuple[dict[int, int], dict[int, Message], dict[int, int]]:
        """Candidate position -> its unit, its complete message and its delta (full cost −
        placeholder cost, tokens), as dicts: built from the candidate arrays when first asked for,
        then kept up to date by :meth:`_add` and :meth:`_extend` (shared with snapshots, as
        :meth:`lend` says)."""
        if self._maps is None:
            assert not self.cand_stale  # (until the dicts exist, the arrays are kept up to date)
            cands = self.candidates
            self._maps = (dict(zip(cands, self.g_cand_unit.view().tolist())), dict(zip(cands, map(self._msgs.__getitem__, cands))),
                          dict(zip(cands, self.g_cand_delta.view().tolist())))
        return self._maps

    def arrays(self) -> dict[str, np.ndarray]:
        """Views of the array forms (int64): ``order``, ``entry_unit``, ``cost``, ``lo``, ``hi``,
        ``pre``, ``cand_delta``, ``cand_unit``."""
        self._fresh_candidates()
        return {"order": self.g_order.view(), "entry_unit": self.g_entry_unit.view(), "cost": self.g_cost.view(),
                "lo": self.g_lo.view(), "hi": self.g_hi.view(), "pre": self.g_pre.view(),
                "cand_delta": self.g_cand_delta.view(), "cand_unit": self.g_cand_unit.view()}

    def lend(self) -> None:
        """Its dicts, per-unit fact lists and breaks are now shared with a snapshot: until the next
        :meth:`_own`, they are only added to (new keys, appended entries), never changed."""
        self._lent = True

    def _own(self) -> None:
        """Before changing what a snapshot may hold: fresh copies of the lent containers."""
        if self._lent:
            self.synthetic = dict(self.synthetic)
            if self._maps is not None:
                self._maps = (dict(self._maps[0]), dict(self._maps[1]), dict(self._maps[2]))
            self.lo, self.hi, self.top, self.ncalls, self.pre = \
                list(self.lo), list(self.hi), list(self.top), list(self.ncalls), list(self.pre)
            self.breaks = list(self.breaks)
            self._lent = False

    def _extend(self, graph: ContextGraph, memo: "_TokenMemo") -> bool:
        msgs = graph.messages
        if self.n < 1 or self.superseded != len(graph.superseded) or not self.units or len(msgs) < self.n:
            return False
        last = self.units[-1]
        t = last.positions[0]
        if msgs[t].role != "assistant" or any(p > t for p in self.outside) \
                or self.starts[-1] + len(last.positions) != len(self.order):
            return False
        changed = False  # whether a new message belongs to the last unit
        for q in range(self.n, len(msgs)):
            m = msgs[q]
            if m.role == "assistant":
                continue
            if m.role != "tool":
                return False
            owner = graph.call_owner.get(m.tool_call_id or "")
            if owner is None or owner < t or graph.result_of.get(m.tool_call_id or "") != q:
                return False
            if owner == t:
                changed = True
        if not changed and t == self.n - 1 and any(c.id not in graph.result_of for c in msgs[t].tool_calls):
            changed = True  # its call was in flight; with a message after it, it gets a synthetic answer
        if not changed:  # the last unit stays as it is: only add the new steps
            for q in range(self.n, len(msgs)):
                if msgs[q].role == "assistant":
                    self._add(q, graph, memo, True)
                    self.last_assistant = q
            return True
        # rebuild the last unit with what arrived, then add the new steps
        self._own()
        self.units.pop()
        start = self.starts.pop()
        del self.order[start:]
        self.g_order.truncate(start)
        self.g_entry_unit.truncate(start)
        for g in (self.g_cost, self.g_lo, self.g_hi):
            g.truncate(len(self.units))
        self.g_pre.truncate(len(self.units) + 1)
        self.full_tokens -= self.fulls.pop()
        self.total_cost -= last.cost
        glue = self.glue.pop()
        if not glue:
            self.breaks.pop()
        for facts in (self.lo, self.hi, self.top, self.ncalls, self.pre):
            facts.pop()
        self.synthetic.pop(t, None)
        gone = last.positions[1:]
        if not self.cand_stale:
            if self.candidates[len(self.candidates) - len(gone):] == sorted(gone):
                self.g_cand_pos.truncate(len(self.candidates) - len(gone))
                self.g_cand_delta.truncate(len(self.candidates) - len(gone))
                self.g_cand_unit.truncate(len(self.candidates) - len(gone))
            else:
                self.maps()  # the arrays fall behind: from now on the dicts are the record
                self.cand_stale = True
        for r in gone:
            if self._maps is not None:
                for d in self._maps:
                    del d[r]
            self.candidates.remove(r)
        for q in range(t, len(msgs)):
            if msgs[q].role == "assistant":
                self._add(q, graph, memo, glue)
                glue = True
                self.last_assistant = q
        return True


_BRIEFS: "weakref.WeakKeyDictionary[ContextGraph, dict[tuple[int, str], tuple[int, Message]]]" = weakref.WeakKeyDictionary()
_MEMOS: "weakref.WeakKeyDictionary[ContextGraph, dict[tuple, _TokenMemo]]" = weakref.WeakKeyDictionary()
_SAVINGS: "weakref.WeakKeyDictionary[ContextGraph, dict[str, _Grow]]" = weakref.WeakKeyDictionary()


def _brief_view(graph: ContextGraph, counter: TokenCounter, pos: int) -> tuple[int, Message] | None:
    """``(tokens saved, brief message)`` of the stored message at ``pos`` (:meth:`Layout.brief`), or
    ``None`` for a message without one (no calls, provider blocks, or no text). The view of a stored
    message never changes: built once per graph."""
    m = graph.messages[pos]
    if not (m.role == "assistant" and m.tool_calls and not m.provider_blocks and m.content):
        return None
    memo = _BRIEFS.setdefault(graph, {})
    key = (pos, counter.encoding_name)
    if key not in memo:
        b = m.with_content(BRIEF.format(tokens=counter.count(m.content), position=pos), "brief")
        memo[key] = (counter.count_message(m) - counter.count_message(b), b)
    return memo[key]


@cache
def brief_rows(stock: bool, encoding: str) -> DerivedKind | None:
    """The derived rows (:mod:`historygraph.history.derived`) of :func:`_brief_savings`: at the position of
    each message with a brief view, the tokens it saves. Named for the encoding, versioned as
    :func:`token_rows`; ``None`` (nothing kept) for a counter other than a plain
    :class:`TokenCounter` (``stock`` false)."""
    if not stock:
        return None
    return DerivedKind(f"render.brief:{encoding}", ("historygraph.render", "historygraph.history.events",
                                                    "historygraph.signals.tokens", "tiktoken.core"))


def _brief_savings(graph: ContextGraph, counter: TokenCounter) -> np.ndarray:
    """Tokens the brief view of each stored message saves (:meth:`Layout.brief`; 0 where there is
    no brief view or it saves nothing), per position, int64: kept per graph and extended as it
    grows, so the revival costs of every dropped step are one array operation. A graph from a
    store reads and keeps them as derived rows (:func:`brief_rows`); the brief messages
    themselves are built only for the units a render revives."""
    per = _SAVINGS.setdefault(graph, {})
    enc = counter.encoding_name
    saved = per.setdefault(enc, _Grow())
    msgs = graph.messages
    if saved.n > len(msgs):
        saved = per[enc] = _Grow()
    if saved.n == len(msgs):
        return saved.view()
    derived = graph.derived
    kind = brief_rows(type(counter) is TokenCounter, enc) if derived.persist else None
    kept = _SAVINGS_KEPT.setdefault(graph, {})
    stored: dict[int, Any] = {}
    if kind is not None:
        snap = brief_snapshot(kind)
        if saved.n == 0:
            a = _restore_savings(graph, derived.take_value(snap, 0))
            if a is not None:
                saved = per[enc] = _Grow(a)
                kept[enc] = (len(a), True)
        # after a snapshot, the rows of the messages added since, one by one (not the whole table decoded)
        stored = _RowsAfter(derived, kind) if kept.get(enc, (0, False))[1] else derived.table(kind)
    new: list[int] = []
    for pos in range(saved.n, len(msgs)):
        v = stored.pop(pos, None)
        if type(v) is int:
            new.append(v)
            continue
        view = _brief_view(graph, counter, pos)
        new.append(max(0, view[0]) if view is not None else 0)
        if view is not None and kind is not None:
            derived.put(kind, pos, new[-1])
    saved.extend(new)
    if kind is not None and snapshot_due(saved.n, kept.get(enc, (0, False))[0]):
        data = {"upto": saved.n, "saved": pack_array(saved.view())}
        derived.put_json(brief_snapshot(kind), 0, msgspec.json.encode(data).decode())
        kept[enc] = (saved.n, kept.get(enc, (0, False))[1])
    return saved.view()


_SAVINGS_KEPT: "weakref.WeakKeyDictionary[ContextGraph, dict[str, tuple[int, bool]]]" = weakref.WeakKeyDictionary()
"""Per graph and encoding: (messages of the last brief-savings snapshot read or put, whether the
savings started from one)."""


@cache
def brief_snapshot(rows: DerivedKind) -> DerivedKind:
    """The per-graph snapshot of :func:`_brief_savings` beside its per-message rows ``rows``
    (:func:`brief_rows`): one row at position 0, ``{"upto", "saved"}``, the savings of the first
    ``upto`` messages as one packed array (:func:`~historygraph.history.derived.pack_array`), put when the
    graph has grown by a quarter since the last one (:func:`~historygraph.history.derived.snapshot_due`)."""
    return DerivedKind(rows.name.replace("render.brief:", "render.briefs:", 1), rows.modules + ("historygraph.history.derived",))


def _restore_savings(graph: ContextGraph, data: Any) -> np.ndarray | None:
    """The savings of a stored snapshot (:func:`brief_snapshot`) when it is one of this graph: of
    no more messages than it holds, whole numbers, not below 0, and none but at an assistant
    message (only those have a brief view)."""
    try:
        upto, a = data["upto"], unpack_array(data["saved"])
    except (TypeError, KeyError, ValueError):
        return None
    if type(upto) is not int or not 0 < upto <= len(graph.messages) or a.shape != (upto,) or a.dtype.kind != "i" \
            or (len(a) and int(a.min()) < 0):
        return None
    turn = np.fromiter(graph.turn_of, dtype=np.int64, count=upto)
    assistant = np.diff(turn, prepend=0) > 0
    if a[~assistant].any():
        return None
    return a.astype(np.int64)


_MEMOS_LOCK = threading.Lock()


def _token_memo(graph: ContextGraph, counter: TokenCounter,
                placeholder: Callable[[Message, TokenCounter], Message]) -> _TokenMemo:
    key = (type(counter), counter.encoding_name, placeholder)
    with _MEMOS_LOCK:
        memos = _MEMOS.setdefault(graph, {})
        memo = memos.get(key)
        if memo is None:
            memo = memos[key] = _TokenMemo(counter, placeholder)
    memo.update(graph)
    return memo


@dataclass(slots=True)
class _Unit:
    """A droppable group of history: one user message, or an assistant message with its results."""

    positions: list[int]
    protected: bool
    cost: int = 0


class _Units:
    """A skeleton's units (a list of :class:`_Unit`), each built when first read from the render
    order, where each unit starts in it, its size and its cost (a reopened session's first render
    reads a few of its thousands). Appended to and popped at the end as a list; :meth:`view` gives
    a layout its own list-like copy."""

    __slots__ = ("order", "starts", "sizes", "costs", "built", "missing")

    def __init__(self, order: list[int] | None = None, starts: list[int] | None = None,
                 sizes: list[int] | None = None, costs: list[int] | None = None) -> None:
        self.order, self.starts, self.sizes, self.costs = order or [], starts or [], sizes or [], costs or []
        self.built: list[_Unit | None] = [None] * len(self.starts)
        self.missing = len(self.starts)  # entries of ``built`` still None

    def __len__(self) -> int:
        return len(self.built)

    def __bool__(self) -> bool:
        return bool(self.built)

    def unit(self, i: int) -> _Unit:
        if i < 0:
            i += len(self.built)
        u = self.built[i]
        if u is None:
            s = self.starts[i]
            u = self.built[i] = _Unit(self.order[s:s + self.sizes[i]], False, self.costs[i])
            self.missing -= 1
        return u

    def __getitem__(self, i: int) -> _Unit:
        return self.unit(i)

    def append(self, unit: _Unit) -> None:
        self.built.append(unit)

    def pop(self) -> _Unit:
        u = self.unit(len(self.built) - 1)
        self.built.pop()
        return u

    def all(self) -> list[_Unit | None]:
        """``built`` with every unit built."""
        if self.missing:
            for i in [i for i, u in enumerate(self.built) if u is None]:
                self.unit(i)
        return self.built

    def view(self) -> "_UnitsView":
        """A list-like copy of the units as they are now (the last one built: extending the
        skeleton pops and rebuilds only that one)."""
        if self.built:
            self.unit(len(self.built) - 1)
        return _UnitsView(self, len(self.built))


class _UnitsView(Sequence[_Unit]):
    """:class:`Layout.units`: the skeleton's units at the time of the layout (``n`` of them, read
    from the skeleton's :class:`_Units`, which only ever adds beyond them or replaces its last
    one, built at the view's creation), with the layout's own replacements."""

    __slots__ = ("base", "n", "own")

    def __init__(self, base: _Units, n: int) -> None:
        self.base, self.n = base, n
        self.own: dict[int, _Unit] = {}
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

    def __setitem__(self, i: int, unit: _Unit) -> None:
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError("unit index out of range")
        self.own[i] = unit

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (_UnitsView, list)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))

    def __iter__(self) -> Iterator[_Unit]:
        units = self.base.all()[:self.n]
        for i, u in self.own.items():
            units[i] = u
        return iter(units)  # type: ignore[arg-type]


_DROP_WINDOW = 64  # markers priced at once by the oldest-first drop's search (Layout._first_within)
_DROP_ONE_BY_ONE = 4  # markers priced one at a time by that search before its first window
_BULK_AFTER = 16  # remove_delta questions on one run before the whole run is priced in bulk
_RUNS_KEPT = 64  # runs' remove deltas kept per graph (Layout._remove_deltas); cleared when full


def _weakly(method: Callable[[int, int], Any]) -> Callable[[int, int], Any]:
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


class _Runs:
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

    def copy(self) -> "_Runs":
        other = _Runs(self.glue, self.cost, self.bulk)
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
            if n > _BULK_AFTER:
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


class _Spans(AbstractSet[int]):
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
    """``_Runs.start`` as a read-only mapping: unit → first unit of its run, for the marked units."""

    __slots__ = ("runs",)

    def __init__(self, runs: _Runs) -> None:
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


class Selection:
    """Running budget state of one greedy pass: tokens used and the dropped steps revived so far.

    ``cost(p)`` is the exact growth of the assembled history if result ``p`` is shown as
    ``layout.shown_cost`` says: its extra tokens over the placeholder, plus, when its step was
    dropped, the step's assistant message and its siblings' placeholders, and the change of the
    dropped-step markers around it (eq. 6 on the assembled history). Reviving a step changes the
    cost of reviving the other steps of its marker's run, so a caller caching costs recomputes
    those after :meth:`take` (``layout.dropped_units``).
    """

    def __init__(self, layout: "Layout") -> None:
        self.layout = layout
        self.used = layout.base_tokens
        self.revived = set()
        self.shown: dict[int, Message] = {}

    @property
    def revived(self) -> set[int]:
        """Dropped units brought back so far. Assigning a set (to roll a selection back) also
        rebuilds the dropped-step marker runs for it."""
        return self._revived

    @revived.setter
    def revived(self, units: set[int]) -> None:
        self._revived = units
        self._table: dict[int, int] | None = None  # every candidate's cost, once asked often (see cost)
        self._asked = 0
        self.runs = self.layout.runs.copy()
        for u in units:
            if self.runs.run_of(u) is not None:
                self.runs.remove(u)

    def cost(self, p: int, form: Message | None = None) -> int:
        """Tokens added by showing result ``p`` as ``form`` (default ``layout.form[p]``)."""
        lay = self.layout
        if form is None or form is lay.form[p]:  # many questions between revivals: price every candidate at once
            if self._table is not None and (hit := self._table.get(p)) is not None:
                return hit
            self._asked += 1
            if self._asked > _BULK_AFTER * 4 and p in lay.form:
                self._table = dict(zip(lay.candidates, self.candidate_costs().tolist()))
                return self._table[p]
        return self.exact_cost(p, form)

    def exact_cost(self, p: int, form: Message | None = None, index: int | None = None) -> int:
        """:meth:`cost` priced for ``p`` alone (no table of every candidate); ``index``: ``p``'s in
        ``layout.candidates`` when the caller has it (then read from the candidate arrays: the
        layout's candidate dicts are not built)."""
        lay = self.layout
        if index is None:
            u = lay.unit_of[p]
            shown = lay.form[p]
        else:
            u, shown = lay.candidate_unit(index), lay.form_at(p, index)
        extra = 0
        if u in lay.dropped_units and u not in self.revived:
            extra = lay.revival_cost(u) + (self.runs.remove_delta(u) if self.runs.run_of(u) is not None else 0)
        if form is None or form is shown:
            delta = lay.delta[p] if index is None else lay.candidate_delta(index)
        else:
            delta = lay.counter.count_message(form) - lay.placeholder_tokens[p]
        return delta + extra

    def lower_costs(self) -> np.ndarray:
        """A lower bound of ``[cost(p) for p in layout.candidates]`` (int64), exact for the results
        of steps not dropped: reviving a dropped step costs at least its own tokens less its run's
        whole marker plus the fewest tokens a marker can have (:attr:`_MarkerPlan.floor`; 0 without
        a plan) for each side of it that stays a run. O(candidates) in numpy plus one marker per
        run, where :meth:`candidate_costs` prices every unit of every run."""
        lay = self.layout
        floor = lay._marker_floor()
        delta, unit = lay._candidate_arrays()
        extra = lay._revival_costs().copy()  # as in _priced, with each run's term added in place
        if self.revived:
            extra[list(self.revived)] = 0
        for a, b in self.runs.end.items():
            whole = lay._marker_tokens(a, b)
            if not floor or a == b:
                extra[a:b + 1] -= whole
            else:
                extra[a:b + 1] += 2 * floor - whole  # a marker left on each side
                extra[a] -= floor  # the first and last unit of the run leave one
                extra[b] -= floor
        return delta + extra[unit]

    def candidate_costs(self) -> np.ndarray:
        """``[cost(p) for p in layout.candidates]`` (int64), in bulk: each run of dropped steps is
        priced for all its units at once."""
        return self._priced(self.layout._remove_deltas)

    def _priced(self, run_term: Callable[[int, int], Any]) -> np.ndarray:
        """Each candidate's delta plus its unit's revival cost (0 for a unit not dropped or revived)
        plus ``run_term(a, b)`` over the units ``a … b`` of each run of dropped steps (a number, or
        one per unit)."""
        lay = self.layout
        delta, unit = lay._candidate_arrays()
        extra = lay._revival_costs().copy()  # 0 but for dropped units
        if self.revived:
            extra[list(self.revived)] = 0
        for a, b in self.runs.end.items():
            extra[a:b + 1] += run_term(a, b)
        return delta + extra[unit]

    def fits(self, p: int, form: Message | None = None) -> bool:
        lay = self.layout
        if lay.budget is None:
            return True
        u = lay.unit_of[p]
        if form is None and u in lay.dropped_units and u not in self.revived \
                and (a := self.runs.run_of(u)) is not None:
            # a lower bound first: reviving the step costs at least its own tokens less the whole
            # marker of its run plus the fewest tokens of a marker per side of it left in the run;
            # most results of dropped steps fail on it, without pricing the markers the revival leaves
            b = self.runs.end[a]
            low = lay.delta[p] + lay.revival_cost(u) - lay._marker_tokens(a, b) + \
                lay._marker_floor() * ((u > a) + (u < b))
            if self.used + low > lay.budget:
                return False
        return self.used + self.cost(p, form) <= lay.budget

    def take(self, p: int, form: Message | None = None, cost: int | None = None, *,
             index: int | None = None, unit: int | None = None) -> None:
        """Show result ``p`` as ``form``: by default ``layout.form[p]`` (the original, or the excerpt
        of an oversized one); a policy may pass a summary or its own stand-in, marked and naming
        the result id (docs/architecture.md, invariant §5.3). ``cost``: :meth:`cost` of it now, when
        the caller has priced it; ``index``: ``p``'s in ``layout.candidates``, and ``unit`` its unit,
        when the caller has those (then read from the candidate arrays: the layout's candidate
        dicts are not built)."""
        if cost is None:
            cost = self.cost(p, form)
        self.used += cost
        lay, revived = self.layout, self._revived
        if index is None:
            u = lay.unit_of[p]
        else:
            u = lay.candidate_unit(index) if unit is None else unit
        if u not in revived:
            if self.runs.run_of(u) is not None:
                self.runs.remove(u)
            if u in lay.dropped_units:  # costs change: the step is back
                self._table, self._asked = None, 0
            revived.add(u)
        if form is None:
            form = lay.form[p] if index is None else lay.form_at(p, index)
        self.shown[p] = form



def _not_shown(tools: np.ndarray, full) -> np.ndarray:  # noqa: ANN001 - a list or an int64 array
    """The result positions of ``tools`` (ascending) that are not in ``full`` (a subset of them, in
    any order): the rendering's omitted results, a new array."""
    if not len(full):
        return tools.copy()
    keep = np.ones(len(tools), dtype=bool)
    keep[np.searchsorted(tools, full)] = False
    return tools[keep]

class Layout:
    """The shared budget accounting for one invocation over the whole ``graph``.

    After construction: ``candidates`` lists every stored tool result a policy may show,
    ``form[p]`` is how it is shown (the original, or for a result whose own cost exceeds B a
    head-and-tail excerpt of ``excerpt_fraction·B`` tokens: the oversized-result fallback of
    ContextRender A.4 with no LLM configured, applied for every policy), ``delta[p]`` is the extra
    cost of showing ``form[p]`` instead of the placeholder, and ``base_tokens`` the cost of the
    retained history with every result as a placeholder; ``excerpts`` lists the candidates whose
    ``form`` is that excerpt (ascending).

    When the retained non-tool history exceeds ``(1 − result_reserve)·B`` the oldest unprotected
    units are dropped until it fits (our decision where ContextRender A.4 is silent: without a
    reserve the assistant messages of a 100-step trace leave no room for any result). A dropped
    step stays a candidate: showing one of its results revives the step, and the revival is
    charged (see :class:`Selection`).

    Policies that leave history out or add synthetic messages say so here, so that the budget
    stays shared: ``omit`` lists positions whose (unprotected) units are left out entirely and are
    not candidates (``omit_units`` the same by unit index, as in ``units`` of a layout of the same graph) (e.g. covered by a summary, or a block a ReCAP baseline did not select);
    ``inserts`` maps a position to a synthetic message rendered right after it (e.g. a summary with
    ``rendered_as="summary"``), charged to B first, like the non-tool history; ``placeholder``
    builds the stand-in of an unshown result (it must name the result id, docs/architecture.md, invariant §5.3).

    Raises:
        BudgetTooSmallError: when ``budget`` cannot hold the protected history.
    """

    def __init__(self, graph: ContextGraph, counter: TokenCounter, budget: int | None,
                 result_reserve: float = 0.5, excerpt_fraction: float = 0.25, omit: Iterable[int] = (),
                 inserts: dict[int, Message] | None = None,
                 placeholder: Callable[[Message, TokenCounter], Message] | None = None,
                 brief_revivals: bool = False, omit_units: Iterable[int] = ()) -> None:
        self.graph, self.counter, self.budget = graph, counter, budget
        self.brief_revivals = brief_revivals
        self._brief: dict[int, tuple[int, Message | None]] = {}
        msgs = graph.messages
        self._reasons: dict[int, str] = {}
        self._pending: list[Callable[[dict[int, str]], None]] = []
        memo = _token_memo(graph, counter, placeholder or placeholder_for)
        sk = memo.skeleton(graph, budget)
        self._memo = memo
        self._tools, self._tools_ph = memo.tools.view(), memo.tools_ph.view()
        self.current_user = sk["current_user"]
        self.first_user: int | None = sk["first_user"]  # position of the first user message
        self.last_assistant: int | None = sk["last_assistant"]  # position of the latest assistant message
        guard = memo.guard
        if guard is None or guard[0] != len(msgs):  # (the graph is append-only: a function of its length)
            guard = memo.guard = (len(msgs), loop_guard(graph, sk["users"]))
        self.loop_guard = guard[1]
        self.order: list[int] = sk["order"]
        self.outside: set[int] = sk["outside"]
        self._tokens = memo.tokens
        self._plan = memo.marker_plan
        self.placeholder: dict[int, Message] = sk["placeholder"]
        self._marks: dict[tuple[int, int], int] = {}
        self._facts: tuple[list[int], list[int], list[int], list[int], list[int]] | None = sk["facts"]
        arr = self._arr = sk["arrays"]
        self._costs: np.ndarray = arr["cost"]
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] = (arr["lo"], arr["hi"], arr["pre"])
        self._starts: list[int] = sk["starts"]
        self._breaks: list[int] = sk["breaks"]
        self._lo: list[int] = sk["facts"][0]  # each unit's message position, ascending (see _unit_at)
        self._build = sk["build"]
        self._sk_candidates: list[int] = sk["candidates"]
        self._dropped_mask = np.zeros(len(self._costs), dtype=bool)  # dropped_units as a mask (kept in step)
        self._bulk: dict[tuple[int, int], np.ndarray] = {}
        self._cand: tuple[np.ndarray, np.ndarray] | None = None
        self._revivals: np.ndarray | None = None
        self.synthetic: dict[int, list[Message]] = sk["synthetic"]  # assistant position -> synthetic results
        self.units: _UnitsView = sk["units"]
        # protected: the first user message, the latest assistant message and the ones that keep the
        # active tool loop's opening on the wire (:func:`loop_guard`); the skeleton's units are shared,
        # so fresh copies
        protected_units = {u for p in (sk["first_user"], sk["last_assistant"], *self.loop_guard)
                           if p is not None and (u := self._unit_at(p)) is not None}
        for i in protected_units:
            u = self.units[i]
            self.units[i] = _Unit(u.positions, True, u.cost)
        self._protected = sorted(protected_units)
        self.full_history_tokens = sk["full_tokens"]

        # units with a position in ``omit`` or listed in ``omit_units``, unprotected, inserted in
        # ascending order (as a scan of the units would)
        found = {u for p in set(omit) if (u := self._unit_at(p)) is not None or (u := self._skeleton_unit_of(p)) is not None}
        found.update(omit_units)
        left_out = set(sorted(found.difference(protected_units)))  # (inserted in ascending order, as before)
        if left_out:
            units = self.units

            def left_out_reasons(reasons: dict[int, str]) -> None:
                for i in left_out:
                    for p in units[i].positions:
                        reasons[p] = "left out by the policy"
            self.defer_reasons(left_out_reasons)
        self.inserts = dict(inserts or {})
        self.left_out = left_out
        # a set, or the spans of the oldest-first drop (:class:`_Spans`) when the policy left nothing out
        dropped_units = set(left_out)
        self.dropped_units: AbstractSet[int] = dropped_units
        left_mask = None
        if left_out:
            self._dropped_mask[list(left_out)] = True
            left_mask = self._dropped_mask.copy()
        # Steps left out get a dropped-step marker where they were (docs/architecture.md, invariant §5.6), charged to B,
        # except those a policy stands in for with its own inserts (a summary names what it covers).
        self.runs = _Runs(self._glue() if self.inserts else sk["glue"], _weakly(self._marker_tokens), _weakly(self._remove_deltas))
        if left_out and not self.inserts:
            self.runs.add_sorted(sorted(left_out))
        self.base_tokens = sk["total_cost"] - (int(self._costs[self._dropped_mask].sum()) if left_out else 0) + \
            sum(counter.count_message(m) for m in self.inserts.values()) + self.runs.total()
        if budget is not None and self.base_tokens > budget and not self.fits_in_full:
            # (when the complete history fits, nothing is dropped: placeholders can cost more than
            # the short results they stand for, and the unchanged history is rendered instead)
            target = int(budget * (1.0 - result_reserve))
            protected = sum(self.units[i].cost for i in protected_units) + \
                sum(counter.count_message(m) for m in self.inserts.values())
            if left_out:
                for i, unit in enumerate(self.units):
                    if self.base_tokens <= max(target, protected):
                        break
                    if unit.protected or i in left_out:
                        continue
                    self.base_tokens += self.runs.add_delta(i) - unit.cost
                    self.runs.add(i)
                    dropped_units.add(i)
                    self._dropped_mask[i] = True
            else:
                self._drop_oldest(max(target, protected))
            if self.base_tokens > budget:
                raise BudgetTooSmallError(budget, self.base_tokens)
        over = sk["over"]
        self._excerpt_forms: dict[int, Message] = {}  # candidate -> its excerpt, for the oversized ones
        if left_mask is not None:  # the skeleton's candidates whose unit is not left out (its unit array is in their order)
            self.candidates = list(itertools.compress(sk["candidates"], (~left_mask[arr["cand_unit"]]).tolist()))
            self.form = {p: msgs[p] for p in self.candidates}
            ph = self.placeholder_tokens
            self.delta = {p: self._tokens[p] - ph[p] for p in self.candidates}
        else:  # the skeleton's, for every candidate: ``form`` and ``delta`` built when first read
            self.candidates = sk["candidates"]
            self._cand = (arr["cand_delta"], arr["cand_unit"])
        self.excerpts: list[int] = []
        for p in over:  # a result whose own cost exceeds B is offered as an excerpt (ContextRender A.4)
            if left_mask is not None and p not in self.form:
                continue
            excerpt = oversized_excerpt(msgs[p], self.full_cost[p], budget, counter, excerpt_fraction)
            if excerpt is not None:  # always one for a candidate here: its cost exceeds B
                bisect.insort(self.excerpts, p)
                self._excerpt_forms[p] = excerpt
                self.reasons[p] = f"oversized: {self.full_cost[p]} tokens > B; offered as a marked excerpt"
                delta = counter.count_message(excerpt) - self.placeholder_tokens[p]
                if left_mask is not None:
                    self.form[p], self.delta[p] = excerpt, delta
                else:
                    assert self._cand is not None
                    if self._cand[0] is arr["cand_delta"]:  # shared with the skeleton: a copy of our own
                        self._cand = (self._cand[0].copy(), self._cand[1])
                    self._cand[0][bisect.bisect_left(self.candidates, p)] = delta

    def _candidate_maps(self) -> None:
        """Set :attr:`unit_of`, :attr:`form` and :attr:`delta` (those not set yet) from the
        skeleton's candidate dicts as of this layout's snapshot: shared with the skeleton while it
        is of the same build, else built from the snapshot's candidate arrays; the excerpts of
        results larger than B replace their complete forms in copies."""
        maps = self._memo.candidate_maps(self._build)
        if maps is None:
            cands, arr = self._sk_candidates, self._arr
            maps = (dict(zip(cands, arr["cand_unit"].tolist())), dict(zip(cands, map(self.graph.messages.__getitem__, cands))),
                    dict(zip(cands, arr["cand_delta"].tolist())))
        unit_of, forms, deltas = maps
        d = self.__dict__
        d.setdefault("unit_of", unit_of)
        if "form" not in d:  # (set in __init__, with "delta", when units are left out)
            if self._excerpt_forms:  # (then the candidate arrays are this layout's own, with the excerpts' deltas)
                assert self._cand is not None
                own = self._cand[0]
                forms = {**forms, **self._excerpt_forms}
                deltas = {**deltas, **{p: int(own[self._index(p)]) for p in self._excerpt_forms}}
            d["form"], d["delta"] = forms, deltas

    @cached_property
    def unit_of(self) -> dict[int, int]:
        """Every candidate's unit (index into :attr:`units`), by position; built when first read
        (shared with the graph's skeleton), with :attr:`form` and :attr:`delta`."""
        self._candidate_maps()
        return self.__dict__["unit_of"]

    @cached_property
    def form(self) -> dict[int, Message]:
        """Every candidate's form when shown: its complete message, or the marked excerpt of a
        result larger than B (:attr:`excerpts`); built when first read, as :attr:`unit_of`."""
        self._candidate_maps()
        return self.__dict__["form"]

    @cached_property
    def delta(self) -> dict[int, int]:
        """Every candidate's tokens shown as :attr:`form` less its placeholder's; built when first
        read, as :attr:`unit_of`."""
        self._candidate_maps()
        return self.__dict__["delta"]

    def _index(self, p: int) -> int:
        """Candidate ``p``'s index in :attr:`candidates`. Raises KeyError when ``p`` is not one."""
        cands = self.candidates
        i = bisect.bisect_left(cands, p)
        if i == len(cands) or cands[i] != p:
            raise KeyError(p)
        return i

    def _unit_at(self, p: int) -> int | None:
        """The unit whose first message is at position ``p``, None when no unit starts there."""
        lo = self._lo
        i = bisect.bisect_left(lo, p)
        return i if i < len(lo) and lo[i] == p else None

    def _skeleton_unit_of(self, p: int) -> int | None:
        """The unit of the skeleton's candidate ``p`` (None when ``p`` is not one), from the arrays."""
        cands = self._sk_candidates
        i = bisect.bisect_left(cands, p)
        return int(self._arr["cand_unit"][i]) if i < len(cands) and cands[i] == p else None

    def form_at(self, p: int, index: int) -> Message:
        """``form[p]`` for the candidate ``p`` at ``index`` in :attr:`candidates`, without building
        :attr:`form`."""
        forms = self.__dict__.get("form")
        if forms is not None:
            return forms[p]
        excerpt = self._excerpt_forms.get(p)
        return self.graph.messages[p] if excerpt is None else excerpt

    def candidate_unit(self, index: int) -> int:
        """``unit_of[candidates[index]]``, from the candidate arrays."""
        return int(self._candidate_arrays()[1][index])

    def candidate_delta(self, index: int) -> int:
        """``delta[candidates[index]]``, from the candidate arrays."""
        return int(self._candidate_arrays()[0][index])

    def candidate_units(self) -> np.ndarray:
        """Every candidate's unit, in :attr:`candidates` order (int64; do not change it)."""
        return self._candidate_arrays()[1]

    @cached_property
    def full_cost(self) -> dict[int, int]:
        """Every tool result's tokens in full, by position (the memo's, shared: built when a
        layout of the graph first reads it)."""
        return self._memo.result_tokens

    @cached_property
    def placeholder_tokens(self) -> dict[int, int]:
        """Every tool result's placeholder tokens, by position (shared as :attr:`full_cost`)."""
        return self._memo.ph_tokens

    @property
    def reasons(self) -> dict[int, str]:
        """Per-position explanation of the decisions so far (policies write theirs here). Reading
        it first applies what :meth:`defer_reasons` put off, in order, so every write lands as if
        made eagerly."""
        if self._pending:
            pending, self._pending = self._pending, []
            for fill in pending:
                fill(self._reasons)
        return self._reasons

    def defer_reasons(self, fill: Callable[[dict[int, str]], None]) -> None:
        """Put off writing reasons: ``fill(reasons)`` runs when :attr:`reasons` is next read, or
        when the rendering's reasons are (:meth:`assemble` passes pending fills on unread).
        ``fill`` must depend only on what it captured."""
        self._pending.append(fill)

    def unit_totals(self, per_position: np.ndarray) -> np.ndarray:
        """For every unit, the sum of ``per_position`` (int64, indexed by graph position) over its
        positions (int64)."""
        at, units = self._arr["order"], self._arr["entry_unit"]
        inside = units >= 0
        return np.bincount(units[inside], weights=per_position[at[inside]],
                           minlength=len(self.units)).astype(np.int64)

    @property
    def unit_costs(self) -> np.ndarray:
        """Every unit's tokens with its results as placeholders (``units[i].cost``; int64, read-only)."""
        return self._costs

    def unit_result_deltas(self) -> np.ndarray:
        """For every unit, the sum of ``delta`` over its candidate results (int64)."""
        delta, unit = self._candidate_arrays()
        return np.bincount(unit, weights=delta, minlength=len(self.units)).astype(np.int64)

    def _drop_oldest(self, limit: int) -> None:
        """Drop the oldest unprotected units until ``base_tokens ≤ limit`` (no unit left out by
        the policy, so no run yet), a segment at a time: within consecutive droppable units that
        share one marker, dropping units ``a..x`` leaves ``base − Σ cost(a..x) + marker(a, x)``,
        priced for every ``x`` at once; the first ``x`` within ``limit`` ends it, as unit by unit."""
        units, glue = self.units, self.runs.glue
        # the units starting a new marker (glue false), ascending: the skeleton's without inserts
        # (lent: entries from n on are of units added to the skeleton since)
        breaks = self._breaks if not self.inserts else None
        i, n = 0, len(units)
        while i < n and self.base_tokens > limit:
            if units[i].protected:
                i += 1
                continue
            # j: the last unit before the next one that starts a new marker (glue false) or is protected
            if breaks is not None:
                b = bisect.bisect_right(breaks, i)
                j = breaks[b] - 1 if b < len(breaks) and breaks[b] < n else n - 1
            else:
                try:
                    j = glue.index(False, i + 1) - 1
                except ValueError:
                    j = n - 1
            k = bisect.bisect_right(self._protected, i)
            if k < len(self._protected):
                j = min(j, self._protected[k] - 1)
            cost = self._costs[i:j + 1].cumsum()
            x, self.base_tokens = self._first_within(i, j, cost, limit)
            self.runs.set_run(i, x)
            spans = self.dropped_units
            if not isinstance(spans, _Spans):
                spans = self.dropped_units = _Spans()
            spans.add_span(i, x)
            self._dropped_mask[i:x + 1] = True
            i = j + 1

    def _first_within(self, i: int, j: int, cost: np.ndarray, limit: int) -> tuple[int, int]:
        """The first ``x`` in ``i..j`` for which dropping units ``i..x`` leaves ``base − cost[x − i] +
        marker(i, x) ≤ limit`` (``j`` when none does) and that base (``cost``: the running sums of
        the units' costs from ``i``). With a marker plan, markers are priced only from the first
        ``x`` that the fewest tokens a marker can have (:attr:`_MarkerPlan.floor`) lets within
        ``limit`` (unit costs are never negative, so ``cost`` never falls), a window at a time."""
        base = self.base_tokens
        if self._plan is None:
            after = base - cost + self._prefix_costs(i, j)
            within = (after <= limit).nonzero()[0]
            x = i + int(within[0]) if len(within) else j
            return x, int(after[x - i])
        s, last = int(cost.searchsorted(base + self._marker_floor() - limit, side="left")), j - i
        # the first few one at a time (almost always the first that the floor lets within the limit:
        # a marker is a few tokens over the floor), then a window at a time
        for t in range(s, min(last, s + _DROP_ONE_BY_ONE - 1) + 1):
            after_t = base - int(cost[t]) + self._marker_tokens(i, i + t)
            if after_t <= limit or t == last:
                return i + t, after_t
        s += _DROP_ONE_BY_ONE
        while s <= last:
            e = min(last, s + _DROP_WINDOW - 1)
            after = base - cost[s:e + 1] + self._prefix_costs(i, i + e, i + s)
            within = (after <= limit).nonzero()[0]
            if len(within):
                return i + s + int(within[0]), int(after[within[0]])
            if e == last:
                return j, int(after[-1])
            s = e + 1
        return j, int(base - cost[last] + self._prefix_costs(i, j, j)[0])

    def revival_cost(self, u: int) -> int:
        """Tokens that bringing back dropped unit ``u`` adds: its whole cost, or with
        ``brief_revivals`` the cost with its assistant message in brief view (:meth:`brief`)."""
        return self.brief(u)[0]

    def brief(self, u: int) -> tuple[int, Message | None]:
        """``(revival cost, brief message or None)`` of unit ``u``. The brief view of an assistant
        message keeps its tool calls and replaces its text by :data:`BRIEF`, which names its
        message number and the tokens left out (ours, beyond the papers: reviving a step for one of its
        results then costs little more than the result). Only for messages with calls, no provider
        blocks (thinking, server tools) and text longer than the marker."""
        hit = self._brief.get(u)
        if hit is None:
            unit = self.units[u]
            hit = (unit.cost, None)
            view = _brief_view(self.graph, self.counter, unit.positions[0]) if self.brief_revivals else None
            if view is not None and view[0] > 0:
                hit = (unit.cost - view[0], view[1])
            self._brief[u] = hit
        return hit

    def _glue(self) -> list[bool]:
        """``glue[i]``: no rendered message (system, current user message, insert) sits between
        unit ``i − 1`` and unit ``i``, so one marker may stand for both when both are left out."""
        first = {u.positions[0]: i for i, u in enumerate(self.units)}
        unit_at = {p: i for i, u in enumerate(self.units) for p in u.positions}
        glue = [False] * len(self.units)
        apart = True
        for p in self.order:
            if p in first:
                glue[first[p]] = not apart
                apart = False
            elif p in self.outside:
                apart = True
            if p in self.inserts and p in unit_at:
                apart = True
        return glue

    def _marker_tokens(self, a: int, b: int) -> int:
        """Tokens of the marker standing for units ``a..b`` (memoised per layout)."""
        key = (a, b)
        n = self._marks.get(key)
        if n is None:
            n = self._fast_marker_tokens(a, b)
            if n is None:
                n = self.counter.count_message(self.marker(a, b))
            self._marks[key] = n
        return n

    def _marker_floor(self) -> int:
        """The fewest tokens any dropped-step marker has (:attr:`_MarkerPlan.floor`), 0 without a
        plan (the bound then assumes nothing)."""
        return max(0, self._plan.floor) if self._plan is not None else 0

    def _fast_marker_tokens(self, a: int, b: int) -> int | None:
        """:meth:`_marker_tokens` from the per-graph :class:`_MarkerPlan`, or ``None`` without one."""
        if self._plan is None:
            return None
        return self._plan.tokens(*self._marker_numbers(a, b))

    def _marker_numbers(self, a: int, b: int) -> tuple[int, int, int]:
        """First and last position and number of calls of units ``a..b``, from per-unit facts
        (a C-level max over the run at worst)."""
        lo, hi, top, _ncalls, pre = self._unit_facts()
        # units are in chronological order of their first message, which is each unit's lowest position
        return lo[a], (hi[top[b]] if top[b] >= a else max(hi[a:b + 1])), pre[b + 1] - pre[a]

    def marker(self, a: int, b: int) -> Message:
        """The dropped-step marker for units ``a..b`` (:func:`dropped_marker`, same message), built
        from per-unit facts, not O(run) Python: selection asks for the markers of many runs per render."""
        return _marker_message(*self._marker_numbers(a, b))

    def _unit_facts(self) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
        """Per unit: lowest and highest position, the unit holding the highest position among
        units 0..i, the number of calls of its first message, and the prefix sums of those
        numbers (computed once per layout)."""
        if self._facts is None:
            msgs = self.graph.messages
            lo = [min(u.positions) for u in self.units]
            hi = [max(u.positions) for u in self.units]
            top: list[int] = []
            for i, h in enumerate(hi):
                top.append(i if not top or h >= hi[top[-1]] else top[-1])
            ncalls = [len(msgs[u.positions[0]].tool_calls) for u in self.units]
            pre = [0]
            for c in ncalls:
                pre.append(pre[-1] + c)
            self._facts = (lo, hi, top, ncalls, pre)
        return self._facts

    def _run_costs(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Marker tokens of the runs ``a..x`` and ``y..b`` for every ``x``, ``y`` in ``a..b``:
        ``P[x − a] = _marker_tokens(a, x)``, ``S[y − a] = _marker_tokens(y, b)`` (int64), with
        the :class:`_MarkerPlan` terms gathered per unit (one by one without a plan)."""
        xs = np.arange(a, b + 1)
        plan = self._plan
        if plan is None:
            return (self._prefix_costs(a, b),
                    np.array([self._marker_tokens(y, b) for y in xs.tolist()], dtype=np.int64))
        lo, hi, pre = self._arrays
        n_s = pre[b + 1] - pre[xs]
        top_s = np.maximum.accumulate(hi[a:b + 1][::-1])[::-1]
        S = plan.const + plan.gather("first", lo[xs]) + plan.gather("last", top_s) + plan.gather("n", n_s)
        return self._prefix_costs(a, b), S

    def _prefix_costs(self, a: int, b: int, s: int | None = None) -> np.ndarray:
        """``P`` of :meth:`_run_costs` alone; from ``x = s`` on when ``s`` (``a ≤ s ≤ b``) is given."""
        s = a if s is None else s
        xs = np.arange(s, b + 1)
        plan = self._plan
        if plan is None:
            return np.array([self._marker_tokens(a, x) for x in xs.tolist()], dtype=np.int64)
        lo, hi, pre = self._arrays
        n_p = pre[xs + 1] - pre[a]
        top_p = np.maximum.accumulate(hi[s:b + 1])
        if s > a:  # the highest position of units a..x, for x from s
            top_p = np.maximum(top_p, hi[a:s].max())
        return plan.const + plan.number("first", int(lo[a])) + plan.gather("last", top_p) + plan.gather("n", n_p)

    def _remove_deltas(self, a: int, b: int) -> np.ndarray:
        """``[runs.remove_delta(i) for i in a..b]`` for the run ``a..b`` (int64, read-only), memoised
        per layout and, for a run before the last unit, per graph across renders
        (:attr:`_TokenMemo.run_deltas`: consecutive renders drop mostly the same runs)."""
        out = self._bulk.get((a, b))
        if out is None:
            kept = self._memo.run_deltas
            key = (self._build, a, b)
            final = b < len(self._costs) - 1  # (the last unit may still gain results)
            out = kept.get(key) if final else None
            if out is None:
                P, S = self._run_costs(a, b)
                out = np.full(len(P), -P[-1], dtype=np.int64)
                out[1:] += P[:-1]
                out[:-1] += S[1:]
                out.flags.writeable = False
                if final:
                    if len(kept) >= _RUNS_KEPT:
                        kept.clear()
                    kept[key] = out
            self._bulk[(a, b)] = out
        return out

    def _candidate_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``delta`` and unit of every candidate, in ``candidates`` order (int64)."""
        if self._cand is None:
            n = len(self.candidates)
            self._cand = (np.fromiter((self.delta[p] for p in self.candidates), dtype=np.int64, count=n),
                          np.fromiter((self.unit_of[p] for p in self.candidates), dtype=np.int64, count=n))
        return self._cand

    def _revival_costs(self) -> np.ndarray:
        """:meth:`revival_cost` of every dropped unit (0 for the others), int64."""
        if self._revivals is None:
            if self.brief_revivals:  # a unit's cost less what the brief view of its first message saves
                saved = _brief_savings(self.graph, self.counter)
                first = self._arrays[0]  # each unit's lowest position: its first message
                self._revivals = np.where(self._dropped_mask, self._costs - saved[first], 0)
            else:  # a unit's whole cost (:meth:`brief` without brief views)
                self._revivals = np.where(self._dropped_mask, self._costs, 0)
        return self._revivals

    @property
    def fits_in_full(self) -> bool:
        """True when the complete history fits in B (then it is rendered unchanged, A.1 line 6)."""
        return self.budget is None or self.full_history_tokens <= self.budget

    def selection(self) -> Selection:
        return Selection(self)

    def assemble_full(self, policy: str) -> Rendering:
        """The complete history, unchanged (ContextRender A.1 lines 6–7)."""
        if not self.dropped_units and not self.inserts and not self.excerpts:
            return self._assemble_whole(policy)
        sel = Selection(self)
        for p in self.candidates:
            sel.take(p)
        return self.assemble(policy, sel)

    def _assemble_whole(self, policy: str) -> Rendering:
        """:meth:`assemble` with every result shown complete, when nothing is dropped or left out,
        nothing inserted and every candidate's form is its stored message: the rendering is the
        render order itself (with the synthetic answers after their calls), built by slices from
        the skeleton, not message by message. Its history tokens are the skeleton's complete
        tokens (every unit complete, synthetic answers included), and nothing else is charged."""
        msgs, order, synthetic = self.graph.messages, self.order, self.synthetic
        get = msgs.__getitem__
        if synthetic:  # the synthetic answers of a unit's message follow it, before its results
            out: list[Message] = []
            positions: list[int | None] = []
            prev = 0
            starts = self._starts
            # (a synthetic answer follows an assistant message: a unit's first message)
            for at, p in sorted((starts[bisect.bisect_left(self._lo, p)] + 1, p) for p in synthetic):
                out += map(get, order[prev:at])
                positions += order[prev:at]
                out += synthetic[p]
                positions += [None] * len(synthetic[p])
                prev = at
            out += map(get, order[prev:])
            positions += order[prev:]
        else:
            out, positions = list(map(get, order)), list(order)
        order_arr, tools = self._arr["order"], self._tools
        is_tool = np.zeros(len(msgs), dtype=bool)
        is_tool[tools] = True
        full_arr = order_arr[is_tool[order_arr]]  # in render order, as assemble appends them
        dropped = np.zeros(0, dtype=np.int64)
        if self.graph.superseded:
            dropped = np.union1d(dropped, np.fromiter(self.graph.superseded, dtype=np.int64))
        history = self.full_history_tokens
        tokens = self._tokens
        total = history + sum(tokens[p] for p in self.outside)
        rendering = Rendering(policy=policy, budget=self.budget, messages=out, positions=positions,
                              full=full_arr.tolist(), omitted=[], dropped=[], history_tokens=history,
                              input_tokens=total)
        rendering.defer_positions(_not_shown(tools, full_arr), dropped)
        rendering.defer_reasons(self._reasons_builder(Selection(self), {}, [], []))
        return rendering

    def assemble(self, policy: str, selection: Selection) -> Rendering:
        """Build the rendering: results in ``selection.shown`` are rendered with the given message
        (the original for full, or an excerpt), other results of retained steps as placeholders,
        dropped steps that were not revived are left out. Chronological."""
        shown = selection.shown
        msgs = self.graph.messages
        # per order entry whether it is left out: its unit is dropped and not revived (a mask, as arrays)
        n_units = len(self._dropped_mask)
        idle = np.empty(n_units + 1, dtype=bool)  # one more, False: entries outside B have unit −1 (kept)
        idle[:n_units] = self._dropped_mask
        idle[n_units] = False
        if selection.revived:
            idle[list(selection.revived)] = False
        at = idle[self._arr["entry_unit"]]
        dropped_at = at.tolist() if self.inserts else at  # (the walk below steps over runs: few look-ups)
        dropped = self._arr["order"][at]
        if self.graph.superseded:
            dropped = np.union1d(dropped, np.fromiter(self.graph.superseded, dtype=np.int64))
        briefs = {self.units[u].positions[0]: b for u in selection.revived if u in self.dropped_units
                  if (b := self.brief(u)[1]) is not None}
        marks: list[tuple[int, str]] = []  # (result, reason) of placeholders and excerpts, in render order
        placeholders: list[int] = []  # the results rendered as their placeholder
        out: list[Message] = []
        positions: list[int | None] = []
        full: list[int] = []
        history = outside = 0  # tokens charged to B, tokens of system and current user messages
        pending: list[Message] = []  # inserts wait for the end of the step they follow
        count, tokens, placeholder = self.counter.count_message, self._tokens, self.placeholder

        def flush() -> None:
            nonlocal history
            for s in pending:
                out.append(s)
                positions.append(None)
                history += count(s)
            pending.clear()

        runs = selection.runs
        unit_at, order, starts, units, lo = self._unit_at, self.order, self._starts, self.units, self._lo
        n_lo, bisect_left = len(lo), bisect.bisect_left
        opening = self.loop_guard[-1] if self.loop_guard else None
        joined: list[int] = []  # text replies left out with the dropped steps after them (see close_run)
        last_marker: list[int] = []  # index in ``out`` and first unit of the latest marker

        def close_run(a: int) -> None:
            """Append the marker of the run of units ``a..runs.end[a]``. In the active tool loop (after
            its opening thinking block) a marker right after an assistant message without tool calls
            would be a wire user turn holding no tool result, and the provider's loop would begin
            after it, at an assistant message without the thinking block (docs/architecture.md,
            invariant §5.7). Such a reply (a late result is rendered before it, at its call) is
            left out with the run, and a marker right before it is merged."""
            nonlocal history
            b = runs.end[a]
            q = positions[-1] if positions else None
            if opening is not None and q is not None and q > opening and msgs[q].role == "assistant" \
                    and not msgs[q].tool_calls and unit_at(q) == a - 1:
                r = out.pop()
                positions.pop()
                history -= tokens[q] if r is msgs[q] else count(r)
                joined.append(q)
                a -= 1
                if last_marker and last_marker[0] == len(out) - 1 and runs.end.get(last_marker[1]) == a - 1:
                    out.pop()
                    positions.pop()
                    history -= self._marker_tokens(last_marker[1], a - 1)
                    a = last_marker[1]
            out.append(self.marker(a, b))
            positions.append(None)
            history += self._marker_tokens(a, b)
            last_marker[:] = [len(out) - 1, a]

        # without inserts, the entries of a run of marked units are those units' positions, one after
        # the other (no message outside B between them), all left out: the walk steps over them
        jump = not self.inserts
        open_run: int | None = None
        k, n_order = 0, len(order)
        while k < n_order:
            p = order[k]
            m = msgs[p]
            if m.role != "tool":
                if pending:
                    flush()
                i = bisect_left(lo, p)  # (what _unit_at says, inline: once per message walked)
                a = runs.run_of(i) if i < n_lo and lo[i] == p else None
                if open_run is not None and a != open_run:
                    close_run(open_run)
                    open_run = None
                if a is not None:
                    open_run = a
                    if jump:
                        last_unit = runs.end[open_run]
                        k = starts[last_unit] + len(units[last_unit].positions)
                        continue
            if not dropped_at[k]:
                if m.role == "tool":
                    ph = placeholder.get(p, m)
                    r = shown.get(p, ph)
                    if r is m:
                        full.append(p)
                        n = tokens[p]
                    else:
                        marks.append((p, "omitted: placeholder" if r.rendered_as == "placeholder" else "excerpt"))
                        if r is ph:  # (counted after the walk, from the memo's arrays)
                            placeholders.append(p)
                            n = 0
                        else:
                            n = count(r)
                else:
                    r = briefs.get(p, m)
                    n = tokens[p] if r is m else count(r)
                out.append(r)
                positions.append(p)
                if p in self.outside:
                    outside += n
                else:
                    history += n
                for s in self.synthetic.get(p, ()):
                    out.append(s)
                    positions.append(None)
                    history += count(s)
            if p in self.inserts:
                pending.append(self.inserts[p])
            k += 1
        flush()
        if open_run is not None:
            close_run(open_run)
        if placeholders:
            history += int(self._tools_ph[self._tools.searchsorted(placeholders)].sum())
        if joined:
            dropped = np.union1d(dropped, np.asarray(joined, dtype=np.int64))
        total = history + outside
        tools = self._tools
        rendering = Rendering(policy=policy, budget=self.budget, messages=out, positions=positions, full=full,
                              omitted=[], dropped=[], history_tokens=history, input_tokens=total)
        # (every result shown in full is one of the graph's results)
        rendering.defer_positions(_not_shown(tools, full), dropped)
        rendering.defer_reasons(self._reasons_builder(selection, briefs, marks, joined))
        return rendering

    def _reasons_builder(self, selection: Selection, briefs: dict[int, Message],
                         marks: list[tuple[int, str]], joined: list[int]) -> Callable[[], dict[int, str]]:
        """The rendering's reasons, built when first read, from what this call captures now
        (copies of what may still change: the policy's reasons, the revived units, the
        superseded results)."""
        base, pending = dict(self._reasons), list(self._pending)
        revived, superseded = set(selection.revived), dict(self.graph.superseded)
        msgs, units, dropped_units, left_out, outside = self.graph.messages, self.units, self.dropped_units, \
            self.left_out, self.outside

        def build() -> dict[int, str]:
            reasons = dict(base)
            for fill in pending:
                fill(reasons)
            for p, later in superseded.items():
                reasons[p] = f"superseded: a later result for the same call (message {later}) is rendered instead"
            why = "retained non-tool history over its share of the budget (oldest first)"
            for u in dropped_units - left_out:  # dropped for the share; a policy's own omissions keep its reason
                for p in units[u].positions:
                    if u in revived:
                        if msgs[p].role != "tool":
                            reasons.setdefault(p, f"kept{' in brief (its text left out)' if p in briefs else ''}: brought "
                                                  f"back because a result of its step is shown (the step was first dropped as {why})")
                    elif p not in reasons:
                        reasons[p] = f"dropped: {why}"
                    elif msgs[p].role == "tool":  # the policy's own choice for it did not take effect
                        reasons[p] = f"dropped with its step: {why}; the policy had decided: {reasons[p]}"
            for p in outside:
                reasons.setdefault(p, "outside B: " + ("system message" if msgs[p].role == "system" else "current user message"))
            for p, why_p in marks:
                reasons.setdefault(p, why_p)
            for p in joined:
                reasons[p] = ("left out with the dropped steps after it: their marker must not follow a text reply "
                              "inside the active tool loop (docs/architecture.md, invariant §5.7)")
            return reasons
        # the selection lives as long as the rendering's reasons may still be built: the reasons a
        # policy deferred may reach it through a weak reference (contextrender), so that the layout's
        # pending reasons do not hold it (selection -> layout -> pending -> selection: a cycle)
        build.selection = selection  # type: ignore[attr-defined]
        return build


class _StoredFacts:
    """What :func:`check_invariants` reads from a graph's stored events alone, kept per graph and
    extended by the events appended since the last check (graphs are append-only), so that a
    check costs O(rendered messages) instead of re-reading the whole history each time:

    * ``systems``: positions of the system messages; ``last_user``: of the latest user message;
    * ``order``/``rank``: :func:`render_order` and each position's index in it. Appending keeps
      them exact in the common case, a non-tool message or a first result of a call of the
      latest non-tool message (it goes at the end, after that message's earlier results, as
      ``render_order`` puts them); any other result (a late one, after a later message, or a
      second one for the same call) rebuilds both from :func:`render_order`;
    * ``counts``: per position, the last message rendered there (the stored event, or a stand-in
      a policy keeps and shows again, such as a placeholder) with its ``counter.count_message``,
      reused only for that very object (messages are immutable), so the recount stays a count
      of what is rendered, made here with ``counter``, not the policy's figure;
    * ``shown``: per position, the last stand-in for the stored event (a placeholder, an excerpt,
      a brief view …) that passed the §5.3 checks against it; the same object shown again is
      not checked again (the checks are a function of the two immutable messages and ``p``).

    Built by this module's own code from ``graph.messages``, ``graph.call_owner`` and
    ``graph.result_of``, never from a policy's layout state. ``lock`` serialises the checks of
    one graph (two threads may check renderings of the same session)."""

    __slots__ = ("n", "last", "systems", "last_user", "order", "rank", "tail", "answered", "counter", "counts", "shown", "lock")

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.lock = threading.Lock()
        self._clear()

    def _clear(self) -> None:
        self.n = 0
        self.last: Message | None = None  # graph.messages[n - 1] when last extended
        self.systems: list[int] = []
        self.last_user: int | None = None
        self.order: list[int] = []
        self.rank: dict[int, int] = {}
        self.tail: int | None = None  # the latest non-tool position: its calls' first results may follow at the end
        self.answered: set[str] = set()  # call ids with a result so far
        self.counts: dict[int, tuple[Message, int]] = {}
        self.shown: dict[int, Message] = {}

    def extend(self, graph: ContextGraph) -> None:
        """Take in ``graph.messages[n:]`` (from scratch when the graph is not this one grown)."""
        msgs = graph.messages
        if len(msgs) < self.n or (self.n and msgs[self.n - 1] is not self.last):
            self._clear()  # not the graph seen before, grown
        rebuild, end = False, len(msgs)
        order, rank, answered, owner_of = self.order, self.rank, self.answered, graph.call_owner
        for p in range(self.n, end):
            m = msgs[p]
            role = m.role
            if role == "tool":
                cid = m.tool_call_id or ""
                if not rebuild and cid not in answered and owner_of.get(cid) == self.tail:
                    rank[p] = len(order)
                    order.append(p)
                else:
                    rebuild = True
                answered.add(cid)
                continue
            self.tail = p
            if not rebuild:
                rank[p] = len(order)
                order.append(p)
            if role == "system":
                self.systems.append(p)
            elif role == "user":
                self.last_user = p
        if rebuild:
            self.order = render_order(graph)
            self.rank = {q: i for i, q in enumerate(self.order)}
        self.n = end
        self.last = msgs[end - 1] if end else None

    def count(self, m: Message, p: int) -> int:
        """``counter.count_message(m)`` for the message rendered at position ``p``."""
        hit = self.counts.get(p)
        if hit is not None and hit[0] is m:
            return hit[1]
        n = self.counter.count_message(m)
        self.counts[p] = (m, n)
        return n


_FACTS: "weakref.WeakKeyDictionary[ContextGraph, dict[TokenCounter, _StoredFacts]]" = weakref.WeakKeyDictionary()
_FACTS_LOCK = threading.Lock()


def _stored_facts(graph: ContextGraph, counter: TokenCounter) -> _StoredFacts:
    with _FACTS_LOCK:
        per = _FACTS.setdefault(graph, {})
        facts = per.get(counter)
        if facts is None:
            facts = per[counter] = _StoredFacts(counter)
    return facts


def check_invariants(rendering: Rendering, graph: ContextGraph, counter: TokenCounter) -> None:
    """Raise :class:`InvariantError` naming the first invariant of docs/architecture.md, invariant §5 that is broken.

    Cost: O(rendered messages + events appended since the graph was last checked), from the
    facts kept per graph (:class:`_StoredFacts`); the result is the same as a check that reads
    the whole history every time."""
    facts = _stored_facts(graph, counter)
    with facts.lock:
        facts.extend(graph)
        _check(rendering, graph, counter, facts)


def _check(rendering: Rendering, graph: ContextGraph, counter: TokenCounter, facts: _StoredFacts) -> None:
    msgs = rendering.messages
    B = rendering.budget
    # 1. budget, recounted independently of the policy's own figure
    outside = set(facts.systems)
    if facts.last_user is not None:
        outside.add(facts.last_user)
    count = facts.count
    history = sum(count(m, p) if p is not None else counter.count_message(m)
                  for m, p in zip(msgs, rendering.positions) if p not in outside)
    if history != rendering.history_tokens:
        raise InvariantError(f"history_tokens {rendering.history_tokens} != recount {history}")
    if B is not None and rendering.policy != "full" and history > B:
        raise InvariantError(f"§5.1 budget: history {history} tokens > B {B}")
    # 2. pairing
    i, n = 0, len(msgs)
    while i < n:
        m = msgs[i]
        if m.role == "tool":
            raise InvariantError(f"§5.2 pairing: tool result {m.tool_call_id} at rendered index {i} has no preceding call")
        if m.role == "assistant" and m.tool_calls:
            j = i + 1
            if len(m.tool_calls) == 1 and j < n and msgs[j].role == "tool" and msgs[j].tool_call_id == m.tool_calls[0].id \
                    and (j + 1 == n or msgs[j + 1].role != "tool"):
                i = j + 1  # the common case: one call, directly followed by its result alone
                continue
            ids = [c.id for c in m.tool_calls]
            got: list[str] = []
            while j < len(msgs) and msgs[j].role == "tool":
                got.append(msgs[j].tool_call_id or "")
                j += 1
            in_flight = j == len(msgs) and not got and rendering.positions[i] == len(graph) - 1
            if not in_flight and got != ids and sorted(got) != sorted(ids):  # equal lists: the same multiset
                raise InvariantError(f"§5.2 pairing: assistant at rendered index {i} calls {ids} but is followed by results {got}")
            i = j
            continue
        i += 1
    # 3. order, verbatim user messages, complete or marked results
    order, rank = facts.order, facts.rank
    real = [rank.get(p, -1) for p in rendering.positions if p is not None]
    if -1 in real or real != sorted(real) or len(set(real)) != len(real):
        raise InvariantError("§5.3 order: rendering is not chronological (results directly after their call)")
    stored, shown = graph.messages, facts.shown
    for m, p in zip(msgs, rendering.positions):
        if p is None or m is stored[p] or shown.get(p) is m:  # the stored event itself, or a stand-in checked before
            continue
        orig = stored[p]
        if m.role in ("user", "assistant", "system") and m != orig and not _is_segment_view(m, orig) \
                and not _is_brief_view(m, orig, p):
            raise InvariantError(f"§5.3 verbatim: {m.role} message at position {p} was altered")
        if m.role == "tool" and m.content != orig.content:
            if m.rendered_as == "compressed":
                if not _is_compressed_view(m, orig):
                    raise InvariantError(f"§5.3 complete: compressed result at position {p} does not name its id "
                                         f"or is not made of pieces of the original in order")
            elif m.rendered_as not in ("placeholder", "excerpt", "summary") or (orig.tool_call_id or "") not in m.content:
                raise InvariantError(f"§5.3 complete: result at position {p} altered without a mark naming its id")
        shown[p] = m
    # 4. in-flight call kept
    if graph.messages and graph.messages[-1].role == "assistant" and graph.messages[-1].tool_calls:
        if not rendering.positions or rendering.positions[-1] != len(graph) - 1:
            raise InvariantError("§5.4 in-flight: the last assistant tool call was cut")
    # 5. under budget → unchanged
    if B is not None and rendering.policy != "full":
        if _fits((counter.count_message(graph.messages[p]) for p in order if p not in outside), B) \
                and not _has_unanswered(graph) and msgs != [graph.messages[p] for p in order]:
            raise InvariantError("§5.5 unchanged: history fits in B but was not returned unchanged")
    # 6. omitted results are retrievable, and a step left out leaves a marker naming where it was
    for p in rendering.omitted:
        if graph.messages[p].role != "tool":
            raise InvariantError(f"§5.6 omitted position {p} is not a stored tool result")
    spans = sorted((int(a), int(b)) for m in msgs if m.rendered_as == "marker"
                   for a, b in _MARK_SPAN.findall(m.content))
    starts = [a for a, _ in spans]
    reach = list(itertools.accumulate((b for _, b in spans), max))  # reach[k]: the furthest end of spans[:k + 1]
    summarised = any(m.rendered_as == "summary" and m.role != "tool" for m in msgs)  # names the span it covers
    for p in sorted(rank.keys() - set(rendering.positions), key=rank.__getitem__):  # in rendering order
        if graph.messages[p].role != "tool" and p not in outside and not summarised:
            k = bisect.bisect_right(starts, p)  # spans[:k] start at or before p: one covers p iff the furthest end reaches it
            if not k or reach[k - 1] < p:
                raise InvariantError(f"§5.6 marker: message {p} was left out without a dropped-step marker naming it")


def _fits(counts: Iterable[int], budget: int) -> bool:
    """Whether the counts sum to at most ``budget`` (stops at the first partial sum over it: a
    long history is over B after its first few messages)."""
    total = 0
    for n in counts:
        total += n
        if total > budget:
            return False
    return True


_MARK_SPAN = re.compile(r"messages #(\d+)–#(\d+)")


def _is_segment_view(m: Message, orig: Message) -> bool:
    """A plain assistant message shown as some of its pieces joined by :data:`SEGMENT_JOIN`, marked
    ``rendered_as="segments"`` (ReCAP §4.4 segmentation ablations); every piece is verbatim."""
    return (m.role == orig.role == "assistant" and m.rendered_as == "segments" and not orig.tool_calls
            and not m.tool_calls and all(piece in orig.content for piece in m.content.split(SEGMENT_JOIN)))


#: The first line of a compressed tool result (the prompt-compression policies, policies/lingua.py).
COMPRESSED_PREFIX = "[tool result {id} compressed by "
#: Where the middle of a long result was left out of a compressed form.
COMPRESSED_GAP = "…"


def _is_compressed_view(m: Message, orig: Message) -> bool:
    """A tool result shown compressed (``rendered_as="compressed"``): a first line starting with
    :data:`COMPRESSED_PREFIX` naming its id, then a text whose characters, apart from
    :data:`COMPRESSED_GAP`, appear in the original in the same order (kept pieces, nothing added)."""
    head, sep, body = m.content.partition("]\n")
    if not sep or not head.startswith(COMPRESSED_PREFIX.format(id=orig.tool_call_id)) or m.tool_call_id != orig.tool_call_id:
        return False
    rest = iter(orig.content.replace(COMPRESSED_GAP, ""))
    return all(c in rest for c in body.replace(COMPRESSED_GAP, ""))


def _is_brief_view(m: Message, orig: Message, position: int) -> bool:
    """An assistant message shown with its tool calls and provider blocks unchanged and its text
    replaced by a :data:`BRIEF` marker naming its message number (``rendered_as="brief"``)."""
    return (m.role == orig.role == "assistant" and m.rendered_as == "brief" and bool(orig.tool_calls)
            and m.tool_calls == orig.tool_calls and m.provider_blocks == orig.provider_blocks
            and m.content.startswith(BRIEF.split("{tokens}", 1)[0])
            and m.content.endswith(f"#{position}]"))


def _has_unanswered(graph: ContextGraph) -> bool:
    last = len(graph) - 1
    return any(c.id not in graph.result_of for p, m in enumerate(graph.messages) if m.role == "assistant" and p != last
               for c in m.tool_calls)
