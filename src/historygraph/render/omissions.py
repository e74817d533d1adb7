"""What a rendering left out and why, as a compact record kept per model call (issue 40).

Each rendering done for a stored session (``Session.render``, ``render_messages(session=…)``, a
proxied request) appends one record to the session's omission stream in the store
(:meth:`historygraph.store.Store.record_omitted`), read back with :meth:`Store.omitted`,
``historygraph show SESSION --omitted`` and ``GET /api/sessions/{id}/omitted``.

The record is made on the request path, so it holds only positions and reason codes, taken from
what the rendering already has (no per-message reason text, which is built only when read,
:meth:`Rendering.defer_reasons`); ids, roles and token sizes are looked up when the record is read
(:func:`expand`): a session is append-only, so a position names the same stored message forever.

A record (:func:`omission_record`) is a JSON object:

* ``events``: messages of the session the rendering was made from (positions ``0 … events−1``);
* ``policy``, ``budget`` (tokens; ``null`` for a rendering without one), ``history_tokens``
  (tokens charged to B), ``omitted`` (number of tool results not rendered complete);
* ``forms``: ``{code: [positions]}`` of messages rendered in a form that leaves something out
  (``placeholder``, ``excerpt``, ``summary``, ``compressed``, ``brief``: :data:`REASONS`);
* ``dropped``: ``[[first, last], …]`` spans of positions left out entirely (a step left out with
  its assistant message, or messages a summary stands for); inclusive;
* ``over_budget``, ``client_curated`` when the proxy noted them (:data:`NOTES`): the B asked for;
  ``cache_stable`` for a cache-stable rendering (:mod:`historygraph.policies.cache_stable`):
  ``"reselected"`` (the wrapped policy chose anew: the history may differ from the previous one
  anywhere, or only after its ``kept_head``), ``"appended"`` (the previous rendering with what arrived since appended after it) or
  ``"collected"`` (a minor collection: the previous rendering's old generation as it was, what
  followed it with some results replaced by placeholders) or ``"expired"`` (re-selected because
  the provider's prompt cache had expired since the previous request); ``kept_head`` (a number of
  rendered messages) for a re-selection that kept the previous one's first messages as they were,
  read from the cache (``tenure``).

Reason codes are those of :data:`REASONS`. They say how the rendering left an item out, which is
what every policy's rendering shows (the policy's own wording, a score below its cut, is in
``explain=True``'s :attr:`Rendering.reasons`, built only when asked for).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from historygraph.history.graph import ContextGraph
from historygraph.render.rendering import Rendering
from historygraph.signals.tokens import TokenCounter

REASONS = {
    "placeholder": "not selected within B: a placeholder naming its id is shown instead",
    "excerpt": "larger than it can be shown: a marked excerpt naming its id is shown (its head, its tail and the lines with the values in use)",
    "summary": "shown as a summary naming its id",
    "compressed": "shown compressed (pieces of the original, naming its id)",
    "brief": "its step was brought back for a result: the tool calls are shown, the text left out",
    "dropped": "left out with its step (older steps are dropped first to fit the non-tool share of B); "
               "a dropped-step marker or a summary names it",
    "superseded": "a later result for the same call is shown instead",
}
"""Reason codes of a record and what each means (docs/library.md, "What was left out")."""

NOTES = ("over_budget", "client_curated")
"""``rendering.stats`` entries a record copies: the budget B asked for when the proxy forwarded the
smallest valid rendering over it, or a client's own context forwarded as sent (docs/proxy.md)."""

FORMS = frozenset(REASONS) - {"dropped", "superseded"}
"""The ``rendered_as`` marks that leave part of a message out (:mod:`historygraph.render.markers`)."""


def omission_record(rendering: Rendering, events: int) -> dict[str, Any]:
    """The compact record of ``rendering`` (see the module docstring), a rendering of a session's
    first ``events`` messages. O(rendered messages + left-out spans); reads no reason text."""
    omitted, dropped = rendering.position_arrays()
    forms: dict[str, list[int]] = {}
    for m, p in zip(rendering.messages, rendering.positions):
        if p is not None and m.rendered_as in FORMS:
            forms.setdefault(m.rendered_as, []).append(p)
    record = {"events": events, "policy": rendering.policy, "budget": rendering.budget,
              "history_tokens": rendering.history_tokens, "omitted": int(omitted.size),
              "forms": forms, "dropped": spans(dropped)}
    for note in NOTES:
        if note in rendering.stats:
            record[note] = rendering.stats[note]
    if (how := rendering.stats.get("cache_stable")) in ("reselected", "appended", "collected", "expired"):
        record["cache_stable"] = how
        if "kept_head" in rendering.stats:
            record["kept_head"] = rendering.stats["kept_head"]
    return record


def spans(positions: np.ndarray) -> list[list[int]]:
    """``[[first, last], …]``: the runs of consecutive integers of ``positions`` (ascending,
    distinct, as :meth:`Rendering.position_arrays` gives them), inclusive; ``[3, 4, 5, 9]`` →
    ``[[3, 5], [9, 9]]``."""
    if positions.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(positions) != 1)
    firsts = [int(positions[0]), *positions[breaks + 1].tolist()]
    lasts = [*positions[breaks].tolist(), int(positions[-1])]
    return [[a, b] for a, b in zip(firsts, lasts)]


@dataclass(frozen=True)
class Omission:
    """One item a rendering left out, as :func:`expand` reads it from a record.

    Attributes:
        position: first stored position (message number) of the item.
        last: last stored position (equal to ``position`` except for a span of dropped messages).
        kind: ``"tool_result"``, or the role of the message(s) (``"assistant"``, ``"user"``, …;
            ``"messages"`` for a span of several non-tool messages).
        id: the tool call id of a tool result (``None`` otherwise).
        tokens: tokens of the stored item(s), what showing it complete would cost.
        reason: a code of :data:`REASONS`.
    """

    position: int
    last: int
    kind: str
    id: str | None
    tokens: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def expand(record: dict[str, Any], graph: ContextGraph, counter: TokenCounter) -> list[Omission]:
    """The items ``record`` says were left out, by position: each tool result on its own row (its
    id and stored tokens), the other messages of a dropped span grouped per run between results.

    Raises:
        ValueError: the record names a position the session does not hold (a record of another store).
    """
    msgs = graph.messages
    out: list[Omission] = []

    def check(p: int) -> None:
        if not 0 <= p < len(msgs):
            raise ValueError(f"omission record names message {p}, but session {graph.session_id!r} holds {len(msgs)}")

    for code, positions in record.get("forms", {}).items():
        for p in positions:
            check(p)
            m = msgs[p]
            kind = "tool_result" if m.role == "tool" else m.role
            out.append(Omission(p, p, kind, m.tool_call_id if m.role == "tool" else None, counter.count_message(m), code))
    for first, last in record.get("dropped", []):
        check(first)
        check(last)
        run: list[int] = []
        for p in range(first, last + 1):
            m = msgs[p]
            if m.role == "tool":
                out.extend(_run(run, msgs, counter))
                run = []
                reason = "superseded" if p in graph.superseded else "dropped"
                out.append(Omission(p, p, "tool_result", m.tool_call_id, counter.count_message(m), reason))
            else:
                run.append(p)
        out.extend(_run(run, msgs, counter))
    return sorted(out, key=lambda o: o.position)


def calls(records: list[dict[str, Any]], graph: ContextGraph, counter: TokenCounter) -> list[dict[str, Any]]:
    """``records`` (a session's, oldest first) as the session API and ``show --omitted --json``
    give them: per call ``{"call": 1, 2, …, "events", "policy", "budget", "history_tokens",
    "omitted", ["over_budget", "client_curated"], "items": [Omission.to_dict(), …]}``.

    Raises:
        ValueError: see :func:`expand`.
    """
    return [{"call": i, **{k: v for k, v in r.items() if k not in ("forms", "dropped")},
             "items": [o.to_dict() for o in expand(r, graph, counter)]} for i, r in enumerate(records, 1)]


def _run(run: list[int], msgs: Any, counter: TokenCounter) -> list[Omission]:
    """One row for a run of dropped non-tool messages (none for an empty run)."""
    if not run:
        return []
    kind = msgs[run[0]].role if len(run) == 1 else "messages"
    return [Omission(run[0], run[-1], kind, None, sum(counter.count_message(msgs[p]) for p in run), "dropped")]
