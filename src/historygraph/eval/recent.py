"""Does the agent still see what it just did? The newest assistant messages in each rendering.

Recall scores the results a policy keeps; it does not see whether the agent can still read its own
last steps. An agent that cannot see what it did three steps ago repeats itself. So for every
rendering made before a recorded call, and for ``k`` in :data:`KS`, the replay counts how many of
the ``k`` newest assistant messages of the history are *shown*: rendered with their text and tool
calls as stored (their results may be placeholders or excerpts; a message left out, in a dropped-step
marker or cut to a brief view is not shown). Only calls with at least ``k`` assistant messages
before them are counted. Per policy the report gives the median and the worst call
(``recent{k}_median``, ``recent{k}_min``) and the share of the counted calls that show all ``k``
(``recent{k}_all``, percent). Beside it, the same count where a message in brief view
(its tool calls as stored, its text replaced by a marker naming its number) counts as shown: what
the agent did, if not what it thought (``recent{k}_calls_median``, ``recent{k}_calls_min``). Ours,
beyond the papers (docs/architecture.md, invariant §5.10, asks for the last 5 by default).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

from historygraph.history.events import Message

KS = (5, 10)


def shown_newest(assistants: Sequence[int], stored: Sequence[Message], rendered: Sequence[Message],
                 positions: Sequence[int | None], k: int) -> int | None:
    """How many of the ``k`` newest assistant messages (``assistants``: their positions in
    ``stored``, oldest first) the rendering (``rendered`` with their stored ``positions``) shows
    with their text and tool calls as stored; ``None`` when fewer than ``k`` precede the call."""
    if len(assistants) < k:
        return None
    return _shown(assistants[-k:], stored, {p: m for m, p in zip(rendered, positions) if p is not None})


def _shown(newest: Sequence[int], stored: Sequence[Message], at: dict[int, Message], calls_only: bool = False) -> int:
    """How many of ``newest`` are rendered with their tool calls as stored and (unless
    ``calls_only``) their text as stored."""
    n = 0
    for p in newest:
        m = at.get(p)
        if m is not None and m.tool_calls == stored[p].tool_calls and (calls_only or m.content == stored[p].content):
            n += 1
    return n


@dataclass
class RecentCounts:
    """Per ``k``, the count shown at each counted call (module docstring), summed over traces."""

    shown: dict[int, list[int]] = field(default_factory=lambda: {k: [] for k in KS})
    calls: dict[int, list[int]] = field(default_factory=lambda: {k: [] for k in KS})  # brief views counted

    def observe(self, assistants: Sequence[int], stored: Sequence[Message], rendered: Sequence[Message],
                positions: Sequence[int | None]) -> None:
        if len(assistants) < min(KS):
            return
        at = {p: m for m, p in zip(rendered, positions) if p is not None}  # built once for every k
        for k in KS:
            if len(assistants) >= k:
                self.shown[k].append(_shown(assistants[-k:], stored, at))
                self.calls[k].append(_shown(assistants[-k:], stored, at, calls_only=True))

    def merge(self, other: "RecentCounts") -> None:
        for k in KS:
            self.shown[k] += other.shown[k]
            self.calls[k] += other.calls[k]

    def columns(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in KS:
            v = self.shown[k]
            out[f"recent{k}_median"] = float(statistics.median(v)) if v else None
            out[f"recent{k}_min"] = min(v) if v else None
            out[f"recent{k}_all"] = 100.0 * sum(x == k for x in v) / len(v) if v else None
            c = self.calls[k]
            out[f"recent{k}_calls_median"] = float(statistics.median(c)) if c else None
            out[f"recent{k}_calls_min"] = min(c) if c else None
        return out


COLUMNS = [f"recent{k}_{s}" for k in KS for s in ("median", "min", "all", "calls_median", "calls_min")]
