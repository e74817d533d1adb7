"""Anthropic prompt-cache breakpoints (``cache_control``) on the Messages requests the proxy forwards.

Source: docs.anthropic.com/en/docs/build-with-claude/prompt-caching: a request carries at most
:data:`MAX_BREAKPOINTS` blocks with ``cache_control`` (tools, ``system`` blocks and message content
blocks; more is a 400); only a prefix that ends at a breakpoint is cached, and a later request reads
it when it repeats that prefix exactly and a breakpoint of its own lies at most 20 blocks after its
end; thinking blocks and empty text blocks cannot carry one; a ``"ttl": "1h"`` breakpoint must not
follow a shorter-lived one.

**Where the proxy puts breakpoints** (:func:`place_breakpoints`, our decision; the same rule as the
evaluator's simulation of that cache, :mod:`historygraph.eval.prompt_cache`, so that the replay's
cost with the cache and the proxy's requests agree):

1. The client's own breakpoints stay where the client put them, on every block still forwarded. A
   block the rendering replaced (a placeholder, an excerpt, a marker) keeps the client's
   ``cache_control`` on its replacement; one on a message the rendering left out entirely moves to
   the next forwarded message (the dropped-step marker that stands for it, when there is one), on
   its last block (:func:`moved_breakpoints`, applied by
   :func:`historygraph.providers.anthropic.from_canonical`). Two landing on one block are one.
2. Ours: one on the last block of the stable head (the last ``system`` block, else the last tool),
   so that a re-selection still reads the tools and system prompt from the cache; one on the last
   block of the last message that can carry one, so that the whole request is written and the next
   request, which with cache-stable rendering (:mod:`historygraph.policies.cache_stable`) only
   appends, reads it; and one on the last block of the opening, the first message, when more
   follow: a re-selection keeps the task and rewrites what comes after it, so the task is read
   from the cache too (on the 14 mini-swe-agent trajectories at B = 6000 the replay's
   Anthropic-style cost of ``learned-stable`` falls from 1.01 to 0.91 of Full history's); and,
   for a cache-stable rendering with a young generation, one at the end of its old generation
   (the block of the last message the previous collection kept fixed), so that a minor
   collection, which rewrites only what follows it, reads the rest from the cache, and at a
   collection one at the end of the new old generation, written for the next. A block that already carries the client's breakpoint gets no second one; a
   top-level ``cache_control`` (the client asks for automatic placement on the last block) stands in
   for ours on the last message.
3. Never more than :data:`MAX_BREAKPOINTS` in all: ours are dropped first (the opening's, then the
   generations' ends, the latest first, then the head's, before the last message's); when the client's own alone are more (a request Anthropic would reject as
   sent), the earliest of them are removed.
4. At a minor collection, which rewrites what follows the old generation's end, and at a
   re-selection that marks a tenure point (``Rendering.stats["tenure"]``: the head the next
   re-selection keeps, written there and read, when kept, here; everything after it is
   rewritten), when rule 3 left no room for a breakpoint at that end (the first boundary), one
   of the client's moves there: one on a message of the rewritten
   part (a prefix no cache holds), not the request's last nor the new generation's end, else the
   first on the tools or system (a prefix inside the one read there). So the collection reads the
   old generation however many blocks its young part holds (the provider looks back only 20 blocks
   from a breakpoint). Its entry exists: the old generation ends right after an assistant message
   (:func:`historygraph.policies.stable_extend.young_start`), where Claude Code marks the message
   before the last, at the request that began the generation.

5. When the rendering asks for it (``young_short``: ``Rendering.stats["cache_young_ttl"]``, the
   cache-stable wrapper's ``young_ttl``), every breakpoint after the end of the old generation
   carries the 5-minute TTL, the client's own included (Claude Code marks its last messages with
   ``"ttl": "1h"``): the young generation is rewritten at its next collection anyway, and a
   5-minute write costs 1.25× input against the hour's 2×; the old generation's end keeps the
   client's hour. Measured with the replay's simulation of that cache on the 40 Claude Code
   sessions (docs/evaluator.md, "Generations"): 3 % off the default's bill at every budget.

6. When the rendering asks for it (``old_long``: ``Rendering.stats["cache_old_ttl"]``, the
   cache-stable wrapper's ``old_ttl``, set once a session on the 5-minute cache has paused for
   longer than 5 minutes), every breakpoint up to the end of the old generation, the client's
   own on the system prompt included, carries ``"ttl": "1h"``, and those after it keep the
   client's 5 minutes: a later pause of up to an hour then rewrites only the young generation.
   The hour needs the ``extended-cache-ttl-2025-04-11`` beta: the proxy adds it to the upstream
   request's ``anthropic-beta`` header whenever a request it sends asks for the hour
   (:func:`historygraph.server.upstream.forward_headers`).
   Measured on the 15 Claude Code sessions on the 5-minute cache (docs/evaluator.md, "After a
   pause, the old generation on the hour"): 4–5 % off the default's bill.

Ours carry ``{"type": "ephemeral"}`` (the 5-minute TTL), ``"ttl": "1h"`` up to rule 6's end, or the
``ttl`` of the nearest client breakpoint after them as the client sent it (none after rule 5's end),
so that TTLs never increase along the request.
"""

from __future__ import annotations

from typing import Any, Sequence

MAX_BREAKPOINTS = 4
"""Blocks with ``cache_control`` one request may carry (Anthropic, "Prompt caching")."""

EPHEMERAL: dict[str, Any] = {"type": "ephemeral"}
UNCACHEABLE = ("thinking", "redacted_thinking")  # "thinking blocks cannot be explicitly marked with cache_control"

Where = tuple[int, int, int]
"""A block's place in the request, in request order: (0, tool index, 0), (1, system block, 0) or
(2, message index, content block index)."""


TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
"""The ``ttl`` values a breakpoint may carry, in seconds (Anthropic, "Prompt caching": 5 minutes by default)."""


EXTENDED_TTL_BETA = "extended-cache-ttl-2025-04-11"
"""The ``anthropic-beta`` value a request with a ``"ttl": "1h"`` breakpoint must carry (Anthropic,
"Prompt caching", 1-hour cache duration): without it the API refuses such a request or keeps the
entry 5 minutes only."""


def asks_hour(body: dict[str, Any]) -> bool:
    """Whether ``body`` (a Messages request) has a breakpoint with ``"ttl": "1h"`` (its top-level
    ``cache_control`` included)."""
    top = body.get("cache_control")
    return (isinstance(top, dict) and top.get("ttl") == "1h") or any(
        b["cache_control"].get("ttl") == "1h" for _, b in _blocks(body)
        if isinstance(b, dict) and isinstance(b.get("cache_control"), dict))


def requested_ttl(body: dict[str, Any]) -> float | None:
    """The longest prompt-cache TTL, in seconds, that ``body`` (a Messages request) asks for on its
    tools, its ``system`` blocks or at its top level (where clients mark the stable head: Claude
    Code writes ``"ttl": "1h"`` there on accounts with the 1-hour cache); ``None`` when none of
    them carries a breakpoint. Message blocks are not read (the request's turns stay unparsed)."""
    system = body.get("system")
    blocks = [*(body.get("tools") or ()), *(system if isinstance(system, list) else ()), body]
    ttls = [TTL_SECONDS.get(cc.get("ttl", "5m"), 300.0) for b in blocks if isinstance(b, dict)
            for cc in [b.get("cache_control")] if isinstance(cc, dict)]
    return max(ttls, default=None)


def cacheable(block: Any) -> bool:
    """Whether a content block may carry ``cache_control`` (not thinking, not an empty text)."""
    return isinstance(block, dict) and block.get("type") not in UNCACHEABLE and not (
        block.get("type") == "text" and not block.get("text"))


def cache_control_of(value: Any) -> dict[str, Any] | None:
    """The ``cache_control`` a wire original carries (a block, a list of blocks, a turn object with
    ``content``): the last one found, else ``None``."""
    if isinstance(value, dict) and "role" in value:
        value = value.get("content")
    if isinstance(value, dict):
        cc = value.get("cache_control")
        return cc if isinstance(cc, dict) else None
    if isinstance(value, list):
        return next((cc for b in reversed(value) if (cc := cache_control_of(b)) is not None), None)
    return None


def with_cache_control(content: Any, cc: dict[str, Any]) -> Any:
    """``content`` (a string or a list of blocks; never changed in place) with ``cc`` on its last
    block that may carry one (a string becomes one text block); unchanged when no block may."""
    if isinstance(content, str):
        return [{"type": "text", "text": content, "cache_control": cc}] if content else content
    if isinstance(content, dict) and "role" in content:
        return {**content, "content": with_cache_control(content.get("content"), cc)}
    if isinstance(content, dict):
        return {**content, "cache_control": cc} if cacheable(content) else content
    if isinstance(content, list):
        for j in range(len(content) - 1, -1, -1):
            if cacheable(content[j]):
                return [*content[:j], {**content[j], "cache_control": cc}, *content[j + 1:]]
    return content


def moved_breakpoints(positions: list[int | None], pieces: list[Any]) -> dict[int, dict[str, Any]]:
    """Rule 1 for messages left out entirely: ``{rendered index: cache_control}`` for each client
    breakpoint on a wire original (``pieces``, indexed by graph position, ``.value`` the original)
    whose position is not rendered (``positions``: the rendering's graph positions, ``None`` for
    synthetic messages and markers): it goes to the first rendered message after the last one from
    an earlier position (the last rendered message when none follows)."""
    shown = {p for p in positions if p is not None}
    out: dict[int, dict[str, Any]] = {}
    for p, piece in enumerate(pieces):
        if p in shown or piece is None or (cc := cache_control_of(piece.value)) is None or not positions:
            continue
        before = max((i for i, q in enumerate(positions) if q is not None and q < p), default=-1)
        out.setdefault(min(before + 1, len(positions) - 1), cc)
    return out


def _blocks(body: dict[str, Any]) -> list[tuple[Where, Any]]:
    """Every block of the request that may hold ``cache_control``, in request order."""
    out: list[tuple[Where, Any]] = [((0, i, 0), t) for i, t in enumerate(body.get("tools") or [])]
    system = body.get("system")
    if isinstance(system, list):
        out += [((1, j, 0), b) for j, b in enumerate(system)]
    elif isinstance(system, str) and system:
        out.append(((1, 0, 0), {"type": "text", "text": system}))
    for k, turn in enumerate(body.get("messages") or []):
        content = turn.get("content") if isinstance(turn, dict) else None
        if isinstance(content, list):
            out += [((2, k, j), b) for j, b in enumerate(content)]
        elif isinstance(content, str) and content:
            out.append(((2, k, 0), {"type": "text", "text": content}))
    return out


def breakpoints(body: dict[str, Any]) -> list[Where]:
    """Where the request's blocks carry ``cache_control``, in request order."""
    return [w for w, b in _blocks(body) if isinstance(b, dict) and isinstance(b.get("cache_control"), dict)]


def count_breakpoints(body: dict[str, Any]) -> int:
    """Breakpoints of a request: its blocks with ``cache_control``, plus one for a top-level
    ``cache_control`` (automatic placement)."""
    return len(breakpoints(body)) + isinstance(body.get("cache_control"), dict)


def place_breakpoints(body: dict[str, Any], boundaries: Sequence[tuple[int, int]] = (),
                      collected: bool = False, young_short: bool = False, old_long: bool = False) -> dict[str, Any]:
    """``body`` (a Messages request as it will be forwarded; never changed in place) with the
    proxy's breakpoints added and at most :data:`MAX_BREAKPOINTS` in all (module docstring, rules
    2 to 4). ``boundaries``: ``(turn index, content block index)`` of each end of a cache-stable
    rendering's generation (:func:`historygraph.providers.anthropic.boundary_block`), each of
    which gets one too: on that block, or the last block before it in its turn that may carry one.
    ``collected``: the request is a minor collection or a re-selection that marks a tenure point,
    which rewrites what follows its first boundary (rule 4). ``young_short``: every breakpoint after the last boundary carries the
    5-minute TTL (rule 5). ``old_long``: every breakpoint up to the last boundary carries the
    1-hour TTL (rule 6)."""
    blocks = _blocks(body)
    client = breakpoints(body)
    top = isinstance(body.get("cache_control"), dict)
    head = next((w for w, b in reversed(blocks) if w[0] < 2 and cacheable(b)), None)
    last = next((w for w, b in reversed(blocks) if w[0] == 2 and cacheable(b)
                 and body["messages"][w[1]].get("role") != "system"), None)
    opening = next((w for w, b in reversed(blocks) if w[0] == 2 and w[1] == 0 and cacheable(b)), None)
    if opening is not None and (len(body["messages"]) < 2 or body["messages"][0].get("role") == "system"):
        opening = None  # the opening is the last message, or a system turn that is not the task
    ends = [next((w for w, b in reversed(blocks) if w[0] == 2 and w[1] == turn and w[2] <= block and cacheable(b)), None)
            for turn, block in boundaries if turn + 1 < len(body.get("messages") or [])]
    ours = [w for w in (last, head, *ends, opening) if w is not None and w not in client and not (w == last and top)]
    ours = list(dict.fromkeys(ours))
    ours = ours[:max(0, MAX_BREAKPOINTS - len(client) - top)]
    excess = len(client) + top - MAX_BREAKPOINTS
    removed = client[:excess] if excess > 0 else []
    read = ends[0] if collected and ends else None  # the old generation's end, which this request reads
    if read is not None and read not in client and read not in ours:  # rule 4
        keep = {client[-1], *ends[1:]} if client else set()  # the request's end, the new generation's end
        stale = [w for w in client if w[0] == 2 and w > read and w not in keep and w not in removed]
        covered = [w for w in client if w[0] < 2 and w not in removed]  # the head, inside the prefix read
        spare = (stale or covered)[:1]
        removed += spare
        if spare:
            ours.append(read)
    end = max((w for w in ends if w is not None), default=None)  # the old generation's end
    short_after = end if young_short else None
    long_to = end if old_long else None
    kept = [(w, b["cache_control"]) for w, b in blocks if w in client and w not in removed]
    retimed = {w: _with_ttl(cc, "5m" if short_after is not None and w > short_after else "1h")  # rules 5 and 6
               for w, cc in kept if (short_after is not None and w > short_after and cc.get("ttl", "5m") != "5m")
               or (long_to is not None and w <= long_to and cc.get("ttl") != "1h")}
    if not ours and not removed and not retimed:
        return body
    marks: dict[Where, dict[str, Any] | None] = {w: None for w in removed}
    for w in ours:
        later = next((cc for v, cc in kept if v > w), None)
        if long_to is not None and w <= long_to:
            marks[w] = _with_ttl(EPHEMERAL, "1h")
        elif later is not None and "ttl" in later and not (short_after is not None and w > short_after):
            marks[w] = _with_ttl(EPHEMERAL, later["ttl"])
        else:
            marks[w] = dict(EPHEMERAL)
    marks.update(retimed)
    return _marked(body, marks)


def _with_ttl(cc: dict[str, Any], ttl: str) -> dict[str, Any]:
    """``cc`` with ``ttl`` ("5m": the default, written as no ``ttl`` key, as clients send it)."""
    out = {k: v for k, v in cc.items() if k != "ttl"}
    return out if ttl == "5m" else {**out, "ttl": ttl}


def _mark(block: Any, cc: dict[str, Any] | None) -> Any:
    if cc is None:
        return {k: v for k, v in block.items() if k != "cache_control"}
    return {**block, "cache_control": cc}


def _marked(body: dict[str, Any], marks: dict[Where, dict[str, Any] | None]) -> dict[str, Any]:
    """``body`` with ``cache_control`` set (a dict) or removed (``None``) at each place of ``marks``."""
    out = dict(body)
    if any(w[0] == 0 for w in marks):
        out["tools"] = [_mark(t, marks[(0, i, 0)]) if (0, i, 0) in marks else t for i, t in enumerate(body["tools"])]
    if any(w[0] == 1 for w in marks):
        system = body["system"]
        if isinstance(system, str):
            system = [{"type": "text", "text": system}]
        out["system"] = [_mark(b, marks[(1, j, 0)]) if (1, j, 0) in marks else b for j, b in enumerate(system)]
    turns = {w[1] for w in marks if w[0] == 2}
    if turns:
        messages = list(body["messages"])
        for k in turns:
            content = messages[k]["content"]
            if isinstance(content, str):
                content = [{"type": "text", "text": content}]
            messages[k] = {**messages[k], "content": [_mark(b, marks[(2, k, j)]) if (2, k, j) in marks else b
                                                      for j, b in enumerate(content)]}
        out["messages"] = messages
    return out
