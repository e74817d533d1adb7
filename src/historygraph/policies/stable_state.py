"""The cache-stable wrapper's state kept in the store, so that every process sharing the store
extends one rendering of a session (issue 49: two proxy instances serving one session in turn,
each with the state in its own memory, re-selected at every request).

The state (:mod:`historygraph.policies.cache_stable`) is the previous rendering of the session,
the number of stored messages it rendered, the budget of the last re-selection, the old
generation's boundary, the tenure point (the head the next re-selection keeps) and the pins then.
It is written after every render that changed it, as one JSON text under
``cache-stable:<policy name>`` (:meth:`historygraph.store.Store.put_policy_state`), and read before
every render of a graph that belongs to a store (:attr:`ContextGraph.store`): when the text differs
from the one this process wrote last, another process rendered the session since, and its state is
decoded and extended instead of this process's.

The text (:func:`encode`), a JSON object with ``format`` (:data:`FORMAT`), ``length``, ``budget``,
``boundary`` (the number of rendered messages in the old generation, fixed until the next
re-selection; 0 when absent), ``tenure`` (the number of rendered messages the next re-selection
keeps; 0 when absent), ``pins``, the rendering's ``policy``, ``rendering_budget``, ``history_tokens`` and ``input_tokens``
(tokens, as the rendering counted them), ``full`` (positions), ``omitted`` and ``dropped`` (inclusive
``[first, last]`` spans of positions) and ``messages``: the rendered messages in order, a run of
stored messages shown as stored as ``[first, last]`` (positions), any other message (a placeholder,
an excerpt, a marker, a recalled copy) whole as ``{"p": position or null, "m": Message.to_dict()}``.
A session is append-only, so a position names the same stored message for ever; a text of another
format, or one naming positions the graph does not hold, is not used (the next render re-selects).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.render import Rendering
from historygraph.render.omissions import spans

log = logging.getLogger("historygraph.policies")

FORMAT = 1
"""The version of the stored text; a text of another version is not read (the next render re-selects)."""

RESTORED = "shown as the previous request showed it (cache-stable rendering; its state read from the store)"
"""The reason given for every position of a rendering decoded from the store (its own reasons are not kept)."""


def key(policy: str) -> str:
    """The store key of the state of the cache-stable policy named ``policy``."""
    return f"cache-stable:{policy}"


def encode(state: dict[str, Any], graph: ContextGraph) -> str:
    """The JSON text of ``state`` (``rendering``, ``length``, ``budget``, ``boundary``, ``tenure``, ``paused``, ``pins``; module docstring),
    a state of ``graph``."""
    r: Rendering = state["rendering"]
    stored = graph.messages
    items: list[Any] = []
    for m, p in zip(r.messages, r.positions):
        if p is not None and m.rendered_as is None and (m is stored[p] or m == stored[p]):
            if items and isinstance(items[-1], list) and items[-1][1] == p - 1:
                items[-1][1] = p
            else:
                items.append([p, p])
        else:
            items.append({"p": p, "m": m.to_dict()})
    omitted, dropped = r.position_arrays()
    return json.dumps({"format": FORMAT, "length": state["length"], "budget": state.get("budget"),
                       "boundary": state.get("boundary", 0), "tenure": state.get("tenure", 0),
                       "paused": bool(state.get("paused")),
                       "pins": sorted(state.get("pins") or ()), "policy": r.policy, "rendering_budget": r.budget,
                       "history_tokens": r.history_tokens, "input_tokens": r.input_tokens, "full": list(r.full),
                       "omitted": spans(omitted), "dropped": spans(dropped), "messages": items},
                      separators=(",", ":"), ensure_ascii=False)


def _expand(runs: list[list[int]]) -> np.ndarray:
    return np.asarray([p for a, b in runs for p in range(a, b + 1)], dtype=np.int64)


def decode(text: str, graph: ContextGraph) -> dict[str, Any] | None:
    """The state :func:`encode` wrote, its rendering rebuilt from ``graph``'s stored messages; ``None``
    for a text of another :data:`FORMAT`, one that is not such an object, or one naming a
    position ``graph`` does not hold."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT or not 0 < data["length"] <= len(graph):
            return None
        stored = graph.messages
        messages: list[Message] = []
        positions: list[int | None] = []
        for item in data["messages"]:
            if isinstance(item, list):
                first, last = item
                if not 0 <= first <= last < data["length"]:
                    return None
                messages += stored[first:last + 1]
                positions += range(first, last + 1)
            else:
                messages.append(Message.from_openai(item["m"]))
                positions.append(item["p"])
        omitted, dropped = _expand(data["omitted"]), _expand(data["dropped"])
        r = Rendering(policy=data["policy"], budget=data["rendering_budget"], messages=messages, positions=positions,
                      full=[int(p) for p in data["full"]], omitted=[], dropped=[], history_tokens=int(data["history_tokens"]),
                      input_tokens=int(data["input_tokens"]), stats={"cache_stable": "restored"})
    except (ValueError, KeyError, TypeError):
        return None
    r.defer_positions(omitted, dropped)
    every = sorted({*r.full, *omitted.tolist(), *dropped.tolist()})
    r.defer_reasons(lambda: dict.fromkeys(every, RESTORED))
    boundary, tenure = (min(max(v, 0), len(messages)) if isinstance(v, int) else 0
                        for v in (data.get("boundary", 0), data.get("tenure", 0)))
    return {"rendering": r, "length": data["length"], "budget": data["budget"], "pins": frozenset(data["pins"]),
            "boundary": boundary, "tenure": tenure, "paused": data.get("paused") is True}


def load(graph: ContextGraph, policy: str, state: dict[str, Any]) -> None:
    """Bring ``state`` (this process's memo of the session's state) up to the one in ``graph``'s
    store, when another process wrote one since this process last wrote or read it."""
    store = graph.store
    if store is None:
        return
    try:
        text = store.policy_state(graph.session_id, key(policy))
    except Exception as exc:  # noqa: BLE001 - a state not read costs a re-selection, never the render
        log.warning("cache-stable state of session %s not read: %s: %s", graph.session_id, type(exc).__name__, exc)
        text = None
    if text is None or text == state.get("text"):
        return
    if text == state.get("stale"):  # older than what this process sent after a failed write: re-select
        return
    state.clear()
    state.update(decode(text, graph) or {})
    state["text"] = text


def save(graph: ContextGraph, policy: str, state: dict[str, Any]) -> None:
    """Write ``state`` to ``graph``'s store (nothing without one). Never raises: when the write fails
    (a full disk), the text stored is older than this process's rendering, so it is marked stale:
    the next render here goes on from this process's memo, not from that text."""
    store = graph.store
    if store is None:
        return
    text = encode(state, graph)
    try:
        store.put_policy_state(graph.session_id, key(policy), text)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        log.warning("cache-stable state of session %s not kept: %s: %s", graph.session_id, type(exc).__name__, exc)
        state["stale"], state["text"] = state.get("text"), None
        return
    state["text"] = text
