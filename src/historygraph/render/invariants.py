"""The invariants every rendering must hold (docs/architecture.md, "Rendering invariants", §5),
checked on a rendering against the stored graph by :func:`check_invariants`, recounting with the
counter that enforces B and never trusting the policy's own figures."""

from __future__ import annotations

import bisect
import itertools
import re
from typing import Callable, Iterable

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.render._facts import StoredFacts, stored_facts
from historygraph.render.markers import BRIEF, COMPRESSED_GAP, COMPRESSED_PREFIX, SEGMENT_JOIN
from historygraph.render.plan import latest_plan
from historygraph.render.rendering import InvariantError, Rendering
from historygraph.signals.tokens import TokenCounter

def check_invariants(rendering: Rendering, graph: ContextGraph, counter: TokenCounter) -> None:
    """Raise :class:`InvariantError` naming the first invariant of docs/architecture.md, invariant §5 that is broken.

    Cost: O(rendered messages + events appended since the graph was last checked), from the
    facts kept per graph (:class:`StoredFacts`); the result is the same as a check that reads
    the whole history every time."""
    facts = stored_facts(graph, counter)
    with facts.lock:
        facts.extend(graph)
        outside = set(facts.systems)  # system messages and the current user message are outside B
        if facts.last_user is not None:
            outside.add(facts.last_user)
        for check in INVARIANTS:
            check(rendering, graph, counter, facts, outside)


def check_budget(rendering: Rendering, graph: ContextGraph, counter: TokenCounter, facts: StoredFacts,
                 outside: set[int]) -> None:
    """§5.1 budget: the history tokens, recounted independently of the policy's own figure, are
    the rendering's, and at most B (but for ``full``)."""
    count = facts.count
    history = sum(count(m, p) if p is not None else counter.count_message(m)
                  for m, p in zip(rendering.messages, rendering.positions) if p not in outside)
    if history != rendering.history_tokens:
        raise InvariantError(f"history_tokens {rendering.history_tokens} != recount {history}")
    B = rendering.budget
    if B is not None and rendering.policy != "full" and history > B:
        raise InvariantError(f"§5.1 budget: history {history} tokens > B {B}")


def check_pairing(rendering: Rendering, graph: ContextGraph, counter: TokenCounter, facts: StoredFacts,
                  outside: set[int]) -> None:
    """§5.2 pairing: every result follows its call, and the calls of an assistant message are
    followed by exactly their results (but for a call in flight, in the last message)."""
    msgs = rendering.messages
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


def check_order_and_completeness(rendering: Rendering, graph: ContextGraph, counter: TokenCounter, facts: StoredFacts,
                                 outside: set[int]) -> None:
    """§5.3 order, verbatim user messages, complete or marked results: the rendering follows the
    render order; a message shown other than as stored is one of the marked views of it."""
    rank = facts.rank
    real = [rank.get(p, -1) for p in rendering.positions if p is not None]
    if -1 in real or real != sorted(real) or len(set(real)) != len(real):
        raise InvariantError("§5.3 order: rendering is not chronological (results directly after their call)")
    stored, shown = graph.messages, facts.shown
    for m, p in zip(rendering.messages, rendering.positions):
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


def check_in_flight(rendering: Rendering, graph: ContextGraph, counter: TokenCounter, facts: StoredFacts,
                    outside: set[int]) -> None:
    """§5.4 in flight: a last assistant message with tool calls is rendered, last."""
    if graph.messages and graph.messages[-1].role == "assistant" and graph.messages[-1].tool_calls:
        if not rendering.positions or rendering.positions[-1] != len(graph) - 1:
            raise InvariantError("§5.4 in-flight: the last assistant tool call was cut")


def check_unchanged_under_budget(rendering: Rendering, graph: ContextGraph, counter: TokenCounter, facts: StoredFacts,
                                 outside: set[int]) -> None:
    """§5.5 unchanged: a history that fits in B (with every call answered) is rendered as stored,
    in render order."""
    B = rendering.budget
    if B is not None and rendering.policy != "full":
        order = facts.order
        if _fits((counter.count_message(graph.messages[p]) for p in order if p not in outside), B) \
                and not _has_unanswered(graph) and rendering.messages != [graph.messages[p] for p in order]:
            raise InvariantError("§5.5 unchanged: history fits in B but was not returned unchanged")


def check_nothing_lost(rendering: Rendering, graph: ContextGraph, counter: TokenCounter, facts: StoredFacts,
                       outside: set[int]) -> None:
    """§5.6 nothing lost: omitted results are stored tool results, and a step left out leaves a
    dropped-step marker naming where it was (or a summary that names what it covers)."""
    msgs, rank = rendering.messages, facts.rank
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


def check_newest_shown(rendering: Rendering, graph: ContextGraph, counter: TokenCounter, facts: StoredFacts,
                       outside: set[int]) -> None:
    """§5.9 the agent sees what it is answering: each result of the latest assistant message's
    calls is rendered complete, or as a marked excerpt naming its id."""
    last = next((p for p in range(len(graph) - 1, -1, -1) if graph.messages[p].role == "assistant"), None)
    if last is None:
        return
    newest = {q for c in graph.messages[last].tool_calls if (q := graph.result_of.get(c.id)) is not None}
    if not newest:
        return
    seen = {p: m for m, p in zip(rendering.messages, rendering.positions) if p in newest}
    for q in sorted(newest):
        m = seen.get(q)
        orig = graph.messages[q]
        if m is None or not (m is orig or m.content == orig.content
                             or (m.rendered_as == "excerpt" and (orig.tool_call_id or "") in m.content)):
            how = "left out" if m is None else f"shown as {m.rendered_as or 'altered text'}"
            raise InvariantError(f"§5.9 newest: result {orig.tool_call_id} (position {q}) of the latest assistant message "
                                 f"was {how}, not complete or an excerpt naming its id")


def check_plan_shown(rendering: Rendering, graph: ContextGraph, counter: TokenCounter, facts: StoredFacts,
                     outside: set[int]) -> None:
    """§5.10 the execution state survives: the assistant message of the agent's latest plan call
    (:func:`~historygraph.render.plan.latest_plan`: Claude Code's ``TodoWrite``, Codex's
    ``update_plan``) is rendered with its tool calls as stored (whole, or in brief view, which
    keeps them)."""
    q = latest_plan(graph)
    if q is None:
        return
    m = _rendered_at(rendering, q)
    if m is None or m.tool_calls != graph.messages[q].tool_calls:
        how = "left out" if m is None else "shown without its calls"
        raise InvariantError(f"§5.10 plan: the agent's latest plan (message {q}) was {how}")


def check_latest_step_shown(rendering: Rendering, graph: ContextGraph, counter: TokenCounter, facts: StoredFacts,
                            outside: set[int]) -> None:
    """§5.10 the agent sees what it just did, for its latest step: the latest assistant message is
    rendered with its text and tool calls as stored (the newest of the 5 the invariant names; the
    other 4 are a target the replay measures, ``eval.recent``), or, a plain message of ReCAP's
    segmentation ablations (ReCAP §4.4), as verbatim pieces of its text."""
    last = next((p for p in range(len(graph) - 1, -1, -1) if graph.messages[p].role == "assistant"), None)
    if last is None:
        return
    m = _rendered_at(rendering, last)
    orig = graph.messages[last]
    if m is None or not (m is orig or (m.content == orig.content and m.tool_calls == orig.tool_calls)
                         or _is_segment_view(m, orig)):
        how = "left out" if m is None else f"shown as {m.rendered_as or 'altered text'}"
        raise InvariantError(f"§5.10 latest step: the latest assistant message (message {last}) was {how}, "
                             "not with its text and calls as stored")


def check_pinned_shown(rendering: Rendering, graph: ContextGraph, counter: TokenCounter, facts: StoredFacts,
                       outside: set[int]) -> None:
    """Pins (docs/architecture.md, "Pins"): every pinned item (:meth:`ContextGraph.pinned`) is
    rendered whole: a pinned message as stored, a pinned tool result complete (not a placeholder,
    excerpt, summary or compressed form)."""
    if not graph.pins:
        return
    pinned = [p for p in graph.pinned() if p not in outside]
    want = set(pinned)
    seen = {p: m for m, p in zip(rendering.messages, rendering.positions) if p in want}
    for p in pinned:
        m, orig = seen.get(p), graph.messages[p]
        if m is None or not (m is orig or (m.content == orig.content if orig.role == "tool" else m == orig)):
            how = "left out" if m is None else f"shown as {m.rendered_as or 'altered text'}"
            raise InvariantError(f"pins: pinned item {graph.item_id(p)} (position {p}) was {how}, not whole")


#: The checks :func:`check_invariants` runs, in the order of docs/architecture.md §5 (of §5.10, the
#: plan and the latest step; the 4 steps before it are a target, measured by the replay), then the pins.
#: §5.7's order (results directly after their call) is checked by §5.2 and §5.3; its protected loop
#: opening and §5.8 (what B counts) are held by the layout (:mod:`historygraph.render`), not checked here.
INVARIANTS: tuple[Callable[[Rendering, ContextGraph, TokenCounter, StoredFacts, set[int]], None], ...] = (
    check_budget, check_pairing, check_order_and_completeness, check_in_flight, check_unchanged_under_budget,
    check_nothing_lost, check_newest_shown, check_plan_shown, check_latest_step_shown, check_pinned_shown)


def _rendered_at(rendering: Rendering, position: int) -> Message | None:
    """The rendered message standing at stored ``position``, ``None`` when the rendering leaves it out."""
    return next((m for m, p in zip(rendering.messages, rendering.positions) if p == position), None)


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
    replaced by a :data:`BRIEF` marker naming its message number (``rendered_as="brief"``; or the
    shorter :data:`~historygraph.render.markers.RECENT_BRIEF`, which starts the same)."""
    return (m.role == orig.role == "assistant" and m.rendered_as == "brief" and bool(orig.tool_calls)
            and m.tool_calls == orig.tool_calls and m.provider_blocks == orig.provider_blocks
            and m.content.startswith(BRIEF.split(" ({tokens}", 1)[0])
            and m.content.endswith(f"#{position}]"))


def _has_unanswered(graph: ContextGraph) -> bool:
    last = len(graph) - 1
    return any(c.id not in graph.result_of for p, m in enumerate(graph.messages) if m.role == "assistant" and p != last
               for c in m.tool_calls)
