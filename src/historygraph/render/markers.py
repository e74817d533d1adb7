"""The stand-ins a rendering shows for what it leaves out, and their templates: the placeholder of a
tool result not shown, the synthetic answer of a call without a result, the dropped-step marker of
a run of steps left out (and :class:`MarkerPlan`, its exact token count from per-slot counts), the
head-and-tail excerpt of a result larger than B (ContextRender A.4), the brief view of an
assistant message; and the marks of the views other policies show (segments, compressed results).
Each names what it stands for and where it is stored (docs/architecture.md, invariants §5.3, §5.6)."""

from __future__ import annotations

import bisect
import operator
import re
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from string import Formatter

import numpy as np

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.signals.media import describe
from historygraph.signals.tokens import MESSAGE_OVERHEAD, TokenCounter

PLACEHOLDER = "[tool result {id} omitted from this context ({size}); it is stored in full and can be restored by id]"
#: A copy of an omitted result appended at the end of a cache-stable rendering (policies/cache_stable.py).
RECALLED = "[tool result {id}, omitted above, shown again in full: the latest tool call used its values]\n{content}"
UNANSWERED = "[error: no result was recorded for tool call {id}]"
SEGMENT_JOIN = "\n[...]\n"  # between the shown pieces of a segmented assistant message (ReCAP ablations)
#: The text of an assistant message shown in brief view (its tool calls kept): what was left out and
#: where it is stored (its message number, as in :data:`DROPPED_MARK`).
BRIEF = "[text omitted ({tokens} tokens); stored in full, restore by message number #{position}]"
#: The brief view of one of the newest assistant messages brought back for what it did
#: (:meth:`~historygraph.render.Selection.revive_recent`): shorter, as the marker of a step the agent
#: has just taken needs no size; it starts as :data:`BRIEF` does and names the message number.
RECENT_BRIEF = "[text omitted; restore by message number #{position}]"
#: The short placeholder of a result of such a step (its call shown, its result not): the id to
#: restore it by, as :data:`PLACEHOLDER` names it, without the size and wording (about half its tokens).
STUB = "[tool result {id} omitted; restore by id]"
#: The dropped-step marker (docs/architecture.md, invariant §5.6): one per run of consecutive steps left out, where they
#: were, charged to B. It names the stored message numbers (positions in the session, ids the recall tool,
#: ``historygraph show --message`` and the session API take), the number of tool calls they hold and how
#: to get them back. Call ids are not listed: providers' ids are long (about 20 tokens each) and a
#: history over B may hold dozens of runs.
DROPPED_MARK = "[omitted: messages #{first}–#{last}, tool calls: {n}; stored in full, restore by message number]"
EXCERPT_MARK = "\n[... tool result {id} truncated: {kept} of {total} tokens shown (head and tail); the full result is stored and can be restored by id ...]\n"
#: The first gap of a focused excerpt (:func:`excerpt_for` with a focus): it names the result id, as
#: :data:`EXCERPT_MARK` does, and the lines it leaves out (1-based, as ``sed -n`` takes them).
FOCUS_MARK = ("\n[... tool result {id} truncated: {kept} of {total} tokens shown (head, tail and the lines with values "
              "in use); lines {first}–{last} left out here; the full result is stored and can be restored by id ...]\n")
#: Every later gap of a focused excerpt: the lines it leaves out (1-based).
GAP_MARK = "\n[... lines {first}–{last} left out ...]\n"
#: The first line of a compressed tool result (the prompt-compression policies, policies/baselines/lingua.py).
COMPRESSED_PREFIX = "[tool result {id} compressed by "
#: Where the middle of a long result was left out of a compressed form.
COMPRESSED_GAP = "…"


def placeholder_for(message: Message, counter: TokenCounter) -> Message:
    """The placeholder of tool result ``message``: its id and size in tokens (text, and the
    estimate of its images, documents or audio, :attr:`Message.media`, which it then names too:
    "(1612 tokens, with 1 image)"; restored whole by the id)."""
    n = counter.count(message.content)
    size = f"{n + counter.count_media(message.media)} tokens, with {describe(message.media)}" if message.media else f"{n} tokens"
    text = PLACEHOLDER.format(id=message.tool_call_id, size=size)
    return message.with_content(text, "placeholder")


def stub_for(message: Message) -> Message:
    """The short placeholder (:data:`STUB`) of tool result ``message``, marked ``placeholder``."""
    return message.with_content(STUB.format(id=message.tool_call_id), "placeholder")


def dropped_marker(graph: ContextGraph, steps: Sequence[Sequence[int]]) -> Message:
    """The marker standing for ``steps`` (consecutive steps left out, each a list of graph
    positions: a message and its results), a ``user`` message marked ``rendered_as="marker"``.
    Shared by every policy (:class:`Layout`, ReCAP). Its size is bounded: three numbers
    (:data:`DROPPED_MARK`)."""
    messages = map(graph.messages.__getitem__, map(operator.itemgetter(0), steps))  # each step's first message
    n_calls = sum(map(len, map(operator.attrgetter("tool_calls"), messages)))
    return marker_message(min(map(min, steps)), max(map(max, steps)), n_calls)


def marker_message(first: int, last: int, n_calls: int) -> Message:
    """:func:`dropped_marker` from its numbers (the text :func:`_marker_parts` joins)."""
    return Message("user", DROPPED_MARK.format(first=first, last=last, n=n_calls), rendered_as="marker")


_FIELDS = Formatter()


def _marker_parts(first: int, last: int, n_calls: int) -> list[tuple[str | None, str]]:
    """The marker's text as ``(slot, text)`` parts, in order: slot ``None`` for fixed wording,
    ``"first"``, ``"last"`` and ``"n"`` for its numbers. :class:`MarkerPlan` counts a marker from them."""
    values = {"first": first, "last": last, "n": n_calls}
    out: list[tuple[str | None, str]] = []
    for literal, name, spec, conversion in _FIELDS.parse(DROPPED_MARK):
        if literal:
            out.append((None, literal))
        if name is not None:
            out.append((name, _FIELDS.format_field(_FIELDS.convert_field(values[name], conversion), spec or "")))
    return out


_SLOT_COUNTS: dict[tuple, list[dict[str, int]]] = {}  # (encoding, wording, slots) -> per-slot value counts
_SLOT_TABLES: dict[tuple, dict[str, np.ndarray]] = {}  # the same as per-slot tables of :meth:`MarkerPlan.gather`
_UNKNOWN = np.iinfo(np.int64).min  # a table entry of MarkerPlan.gather not computed yet


class MarkerPlan:
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
    def build(cls, counter: TokenCounter) -> "MarkerPlan | None":
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


_PLANS: dict[tuple[type, str, str], "MarkerPlan | None"] = {}


def marker_plan(counter: TokenCounter) -> "MarkerPlan | None":
    """:meth:`MarkerPlan.build` for ``counter``, one per counter type, encoding and marker wording
    (what the plan counts depends on those alone, as for :class:`TokenMemo`), shared by every graph."""
    key = (type(counter), counter.encoding_name, DROPPED_MARK)
    if key not in _PLANS:
        _PLANS[key] = MarkerPlan.build(counter)
    return _PLANS[key]


_excerpts: dict[tuple[str, int, str | None, int, frozenset[str]], Message] = {}


def excerpt_for(message: Message, max_tokens: int, counter: TokenCounter, focus: AbstractSet[str] = frozenset()) -> Message:
    """A marked excerpt of tool result ``message`` of at most ``max_tokens`` tokens (whole message,
    overhead included), naming the result id (ContextRender A.4 oversized-result fallback when no
    LLM is configured). Without ``focus`` (or when none of its values is in the result's text, or
    the text is not cut into lines that :func:`focused_text` can use) it is the head and the tail
    with :data:`EXCERPT_MARK` between them; with ``focus`` (values the agent is working on,
    :func:`historygraph.render.focus.focus_values`) it is the focused excerpt of
    :func:`focused_text`. Either way the text is pieces of the original, in order, and marks. When
    ``max_tokens`` cannot hold the marker and some of the text, the result's placeholder is
    returned instead (``rendered_as="placeholder"``). The stored original is unchanged. Excerpts are
    memoised per (encoding, size, id, content hash, focus values found in the text)."""
    content = message.content
    found = frozenset(v for v in focus if v in content)
    key = (counter.encoding_name, max_tokens, message.tool_call_id, hash(content), found)
    hit = _excerpts.get(key)
    if hit is None:
        overhead = counter.count_message(message.with_content("", "excerpt"))
        text = focused_text(message, max_tokens - overhead, counter, found) if found else None
        hit = message.with_content(text, "excerpt") if text is not None else _make_excerpt(message, max_tokens - overhead, counter)
        if len(_excerpts) > 256:
            _excerpts.clear()
        _excerpts[key] = hit
    return hit


def oversized_excerpt(message: Message, cost: int, budget: int | None, counter: TokenCounter,
                      excerpt_fraction: float = 0.25, focus: AbstractSet[str] = frozenset()) -> Message | None:
    """The stand-in of a tool result whose own ``cost`` (tokens) exceeds ``budget``: its marked
    excerpt (:func:`excerpt_for`, focused on ``focus``) of ``excerpt_fraction·budget`` tokens (at
    least 16); ``None`` when the result fits. The oversized-result fallback every policy shares
    (ContextRender A.4, no LLM)."""
    if budget is None or cost <= budget:
        return None
    return excerpt_for(message, max(16, int(excerpt_fraction * budget)), counter, focus)


#: Lines of context kept on each side of a line that holds a focus value (our choice, docs/policies.md).
FOCUS_CONTEXT = 2
#: The share of a focused excerpt's text first offered to the focus lines (the rest, and what they
#: leave, goes to the head and the tail, two to one as in the head-and-tail excerpt; our choice).
FOCUS_SHARE = 0.6
_WORD = re.compile(r"[A-Za-z0-9_]")


def focused_text(message: Message, max_tokens: int, counter: TokenCounter, focus: AbstractSet[str]) -> str | None:
    """The text of a focused excerpt of ``message`` in at most ``max_tokens`` tokens (text only), or
    ``None`` when it cannot make one (no line holds a focus value as a whole word, every such line
    alone is longer than an eighth of ``max_tokens``, or the marks leave no room).

    Lines are scored by the focus values they hold, each value weighing ``1 / (lines holding it)``
    (a rare value marks a line more than one on every line, like TFA's ``1 / n_t`` in ContextRender
    eq. 1). Taking lines best first, each with :data:`FOCUS_CONTEXT` lines around it, it fills
    :data:`FOCUS_SHARE` of the tokens; the head and the tail (whole lines, the first one cut when it
    alone is too long) get the rest, two to one. The kept lines are shown in their original order,
    the first gap marked by :data:`FOCUS_MARK` (naming the id and the token counts), every other by
    :data:`GAP_MARK`, each naming the 1-based lines it leaves out. Shrinks until the exact count
    fits (seams can add a token)."""
    lines = message.content.split("\n")
    n = len(lines)
    if n < 3:
        return None
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    text = message.content
    holders: dict[str, list[int]] = {}
    for v in focus:
        at: list[int] = []
        i = text.find(v)
        while i >= 0:
            end = i + len(v)
            if not (i and _WORD.match(text[i - 1])) and not (end < len(text) and _WORD.match(text[end])):
                row = bisect.bisect_right(starts, i) - 1
                if not at or at[-1] != row:
                    at.append(row)
            i = text.find(v, end)
        if at:
            holders[v] = at
    if not holders:
        return None
    score: dict[int, float] = {}
    for at in holders.values():
        for row in at:
            score[row] = score.get(row, 0.0) + 1.0 / len(at)
    ranked = sorted(score, key=lambda i: (-score[i], i))
    cost = _line_costs(counter, text, lines)
    total = counter.count(text)
    mark_cost = counter.count(FOCUS_MARK.format(id=message.tool_call_id, kept=total, total=total, first=n, last=n))
    gap_cost = counter.count(GAP_MARK.format(first=n, last=n))
    keep = max_tokens - mark_cost
    while keep > 0:
        out = _focused_once(message, lines, cost, ranked, keep, gap_cost, counter, total)
        if out is None:
            return None
        if counter.count(out) <= max_tokens:
            return out
        keep -= max(4, keep // 20)
    return None


_LINE_COSTS: dict[tuple[str, int], list[int]] = {}  # (encoding, content hash) -> tokens per line


def _line_costs(counter: TokenCounter, text: str, lines: list[str]) -> list[int]:
    """Tokens of each line of ``text`` plus one for its line break, kept per text (not in the
    counter's memo: a long result's lines would crowd out the messages' counts)."""
    key = (counter.encoding_name, hash(text))
    hit = _LINE_COSTS.get(key)
    if hit is None:
        if len(_LINE_COSTS) > 64:
            _LINE_COSTS.clear()
        hit = _LINE_COSTS[key] = [len(counter.encode(line)) + 1 for line in lines]
    return hit


def _focused_once(message: Message, lines: list[str], cost: list[int], ranked: list[int], keep: int, gap_cost: int,
                  counter: TokenCounter, total: int) -> str | None:
    """One try of :func:`focused_text` with ``keep`` tokens for the text and the later gap marks."""
    n = len(lines)
    chosen = [False] * n
    room = int(FOCUS_SHARE * keep)
    longest = keep // 8
    for i in ranked:
        lo, hi = max(0, i - FOCUS_CONTEXT), min(n, i + FOCUS_CONTEXT + 1)
        new = [j for j in range(lo, hi) if not chosen[j] and cost[j] <= longest]
        if i not in new:
            continue
        need = sum(cost[j] for j in new) + gap_cost
        if need <= room:
            room -= need
            for j in new:
                chosen[j] = True
    if not any(chosen):
        return None
    left = keep - (int(FOCUS_SHARE * keep) - room)
    head_room, tail_room = left - left // 3, left // 3
    clip = ""  # the first line cut to the head's room, when it alone is longer
    j = 0
    while j < n and (chosen[j] or cost[j] <= head_room):
        if not chosen[j]:
            head_room -= cost[j]
            chosen[j] = True
        j += 1
    if j == 0 and head_room > 0:
        clip = counter.truncate(lines[0], head_room)
    j = n - 1
    while j >= 0 and (chosen[j] or cost[j] <= tail_room):
        if not chosen[j]:
            tail_room -= cost[j]
            chosen[j] = True
        j -= 1
    if all(chosen):
        return None  # (the result fits whole: not an excerpt)
    runs: list[tuple[int, int, str]] = []  # (first line, last line, text) of each run of kept lines, 0-based
    for j in range(n):
        if chosen[j]:
            if runs and runs[-1][1] == j - 1:
                runs[-1] = (runs[-1][0], j, "")
            else:
                runs.append((j, j, ""))
    runs = [(a, b, "\n".join(lines[a:b + 1])) for a, b, _ in runs]
    if clip:
        runs.insert(0, (0, 0, clip))
    kept = sum(counter.count(t) for _, _, t in runs)
    out: list[str] = []
    shown, partial, marked = 0, False, False  # next line not yet placed; the last piece a cut line; FOCUS_MARK used
    for k, (a, b, t) in enumerate(runs + [(n, n, "")]):
        if a > shown or partial:  # lines left out before this piece (1-based, the cut line among them)
            first = shown if partial else shown + 1
            out.append(GAP_MARK.format(first=first, last=a) if marked else
                       FOCUS_MARK.format(id=message.tool_call_id, kept=kept, total=total, first=first, last=a))
            marked = True
        out.append(t)
        shown, partial = b + 1, bool(clip) and k == 0
    return "".join(out)


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



_BRIEFS = "render.brief_views"  # graph.memo key: {(position, encoding): (tokens saved, brief message)}
_RECENT_BRIEFS = "render.recent_brief_views"  # the same for recent_brief_view


def _memo_brief(graph: ContextGraph, counter: TokenCounter, pos: int, memo_key: str,
                text: Callable[[Message], str]) -> tuple[int, Message] | None:
    """``(tokens saved, brief message)`` of the stored message at ``pos`` with ``text(message)`` as
    its text, memoised per graph under ``memo_key``; ``None`` for a message without a brief view (no
    calls, provider blocks, or no text). The view of a stored message never changes."""
    m = graph.messages[pos]
    if not (m.role == "assistant" and m.tool_calls and not m.provider_blocks and m.content):
        return None
    memo: dict[tuple[int, str], tuple[int, Message]] = graph.memo(memo_key, dict)
    key = (pos, counter.encoding_name)
    if key not in memo:
        b = m.with_content(text(m), "brief")
        memo[key] = (counter.count_message(m) - counter.count_message(b), b)
    return memo[key]


def brief_view(graph: ContextGraph, counter: TokenCounter, pos: int) -> tuple[int, Message] | None:
    """``(tokens saved, brief message)`` of the stored message at ``pos`` (:meth:`Layout.brief`), or
    ``None`` for a message without one (no calls, provider blocks, or no text). The view of a stored
    message never changes: built once per graph."""
    return _memo_brief(graph, counter, pos, _BRIEFS, lambda m: BRIEF.format(tokens=counter.count(m.content), position=pos))


def recent_brief_view(graph: ContextGraph, counter: TokenCounter, pos: int) -> tuple[int, Message] | None:
    """:func:`brief_view` with :data:`RECENT_BRIEF`: ``(tokens saved, brief message)`` of the stored
    message at ``pos``, or ``None`` where it has none (as :func:`brief_view`)."""
    return _memo_brief(graph, counter, pos, _RECENT_BRIEFS, lambda m: RECENT_BRIEF.format(position=pos))
