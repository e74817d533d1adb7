"""Later-Used Result Recall (ContextRender Appendix B.4).

Reuse events are labelled on the recorded transcript alone, with a rule that is deliberately
*not* TFA's (B.4, "Relation to production matching"):

* eligible tokens are maximal runs of at least six letters, digits or underscores
  (``[A-Za-z0-9_]{6,}``) containing at least one uppercase letter or underscore; Titlecase words
  qualify;
* a token is linked to tool result ``r`` only when its first appearance in the transcript
  (system prompt, user messages, assistant messages and tool results alike) is in ``r``;
* an assistant turn ``j`` after ``r`` that contains the token (prose, code or tool-call
  arguments) labels the event ``(j, r)``; each distinct pair counts once, however many tokens
  match.

Value recall (beside B.4, not in the paper): an event ``(j, r)`` is a value hit when every token
that links ``j`` to ``r`` appears as a token anywhere in the rendering made before ``j``: in a full
result, an excerpt, a summary, a placeholder or marker, or any other rendered message. It judges
stand-ins by the values they keep (a summary that keeps ``DB_PORT`` serves a later use of it; B.4
counts it a miss). Every B.4 hit is a value hit, so value recall ≥ B.4 recall.

Visibility: ``r`` is visible at ``j`` only if its complete original text is in the rendering
made immediately before ``j`` (an excerpt or summary does not count). Recall (eq. 8) is
``100 · hits / |E|``. Result age is counted in turns (model invocations) as in §3.3: the age of
event ``(j, r)`` is the number of assistant messages before ``j`` minus the number at or before
``r``. Age bins follow Table 2: ≤3, 4–10, 11–25, >25.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from historygraph.history.events import Message

TOKEN = re.compile(r"[A-Za-z0-9_]{6,}")
_QUALIFY = re.compile(r"[A-Z_]")
AGE_BINS = ("<=3", "4-10", "11-25", ">25")


def recall_tokens(text: str) -> set[str]:
    """Eligible B.4 tokens of ``text``."""
    return {t for t in TOKEN.findall(text) if _QUALIFY.search(t)}


def age_bin(age: int) -> str:
    return AGE_BINS[0] if age <= 3 else AGE_BINS[1] if age <= 10 else AGE_BINS[2] if age <= 25 else AGE_BINS[3]


@dataclass(frozen=True, slots=True)
class ReuseEvent:
    turn: int      # position of the assistant message j
    result: int    # position of the tool result r
    age: int       # turns between r and j
    tokens: frozenset[str] = field(default=frozenset(), compare=False)  # the tokens linking j to r


_runs: dict[str, frozenset[str]] = {}


def _token_runs(text: str) -> frozenset[str]:
    """``TOKEN`` runs of ``text``, memoised per text (a replay scans the same messages at every call)."""
    hit = _runs.get(text)
    if hit is None:
        if len(_runs) > 50_000:
            _runs.clear()
        hit = _runs[text] = frozenset(TOKEN.findall(text))
    return hit


def rendered_tokens(messages: Iterable[Message]) -> set[str]:
    """Every ``[A-Za-z0-9_]{6,}`` run in rendered messages (contents and tool-call arguments): what
    value recall looks the linking tokens up in."""
    out: set[str] = set()
    for m in messages:
        out |= _token_runs(m.content)
        for c in m.tool_calls:
            out |= _token_runs(c.arguments)
    return out


def value_hit(event: ReuseEvent, visible_tokens: set[str]) -> bool:
    """Value recall's rule: every token linking the event's turn to its result is visible."""
    return bool(event.tokens) and event.tokens <= visible_tokens


def _assistant_text(m: Message) -> str:
    return "\n".join([m.content] + [f"{c.name} {c.arguments}" for c in m.tool_calls])


def reuse_events(messages: Sequence[Message]) -> list[ReuseEvent]:
    """The fixed B.4 event set of a transcript, in turn order."""
    first_seen: dict[str, int | None] = {}  # token -> result position, or None if first seen elsewhere
    turns_before = 0
    turn_of: list[int] = []
    events: list[ReuseEvent] = []
    for p, m in enumerate(messages):
        if m.role == "assistant":
            text = _assistant_text(m)
            toks = recall_tokens(text)
            linked: dict[int, set[str]] = {}
            for t in toks:
                seen = first_seen.get(t)
                if seen is not None:
                    linked.setdefault(seen, set()).add(t)
            for r in sorted(linked):
                events.append(ReuseEvent(turn=p, result=r, age=turns_before - turn_of[r], tokens=frozenset(linked[r])))
            turns_before += 1
        else:
            toks = recall_tokens(m.content)
        src = p if m.role == "tool" else None
        for t in toks:
            first_seen.setdefault(t, src)
        turn_of.append(turns_before)
    return events
