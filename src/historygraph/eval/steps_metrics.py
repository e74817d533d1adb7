"""Step-level evaluator metrics of ContextWeaver §5.5 and Appendix A, measured on replays.

Both are computed for every policy from the rendering made before each recorded assistant turn
(:func:`historygraph.eval.replay.replay_trace`):

* **Repeated-read exposure** ("Less re-reading", §5.5): a *read command* is a tool call that only
  shows existing content: a shell command (the ``command``/``cmd`` argument, after any leading
  ``cd DIR &&`` or ``cd DIR;``) whose program is one of :data:`READERS` (``sed`` only with ``-n``),
  or a file-editor ``view`` call. A call in turn ``j`` that repeats an earlier read command
  exactly (same tool, same command text after collapsing whitespace; for editor views the same
  path and range) is a *repeated read*; it is *exposed* when none of the earlier identical calls'
  results was shown in full in the rendering made before ``j``, i.e. the policy had omitted what
  the agent read again. The recorded agent is fixed, so exposure counts the repeats a policy's
  context would not have prevented; lower is better.
* **Share of old full observations** (§5.5 "What the graph keeps", Figure 4): over the renderings
  that omit at least one result (the policy is choosing), the results shown in full that are
  older than the two steps before the current one (age ≥ 3 turns, the current step has age 0)
  are *kept beyond the recent steps*; those more than six steps old (age > 6) are *old*. The
  share is ``100 · old / kept beyond`` (the paper reports 56–57 % for ContextWeaver). Results of
  at most :data:`SHORT_CHARS` characters are not counted: they are as short as a node summary, so
  ContextWeaver shows them as they are and keeping them says nothing about selection.

Ages are in turns (assistant messages) as in :meth:`historygraph.history.graph.ContextGraph.age`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from historygraph.history.events import Message, ToolCall
from historygraph.history.graph import ContextGraph

READERS = frozenset({"cat", "head", "tail", "less", "more", "nl", "grep", "egrep", "rg", "find", "ls", "tree", "wc"})
_CD = re.compile(r"^\s*cd\s+\S+\s*(?:&&|;)\s*")
_EDITORS = frozenset({"str_replace_editor", "str_replace_based_edit_tool", "file_editor", "edit_file", "editor"})
RECENT_STEPS = 3   # the current step and the two before it
OLD_AGE = 6        # "more than six steps old"
SHORT_CHARS = 300  # the node-summary limit of ContextWeaver §3.3


def read_key(call: ToolCall) -> str | None:
    """A normalised key for a read command (module docstring), or ``None`` for any other call."""
    try:
        args: Any = json.loads(call.arguments)
    except ValueError:
        args = None
    if not isinstance(args, dict):
        return None
    cmd = args.get("command", args.get("cmd"))
    if call.name in _EDITORS:
        if cmd == "view":
            return f"{call.name} view {args.get('path')} {args.get('view_range')}"
        return None
    if not isinstance(cmd, str):
        return None
    text = cmd
    while (m := _CD.match(text)):
        text = text[m.end():]
    words = text.split()
    if not words or words[0] not in READERS and not (words[0] == "sed" and "-n" in words[1:3]):
        return None
    return f"{call.name}: {' '.join(words)}"


@dataclass
class StepsCounts:
    """Counts behind the two metrics for one policy (summed over invocations and traces)."""

    read_repeats: int = 0
    read_repeats_exposed: int = 0
    full_beyond_recent: int = 0
    full_old: int = 0

    def observe(self, graph: ContextGraph, visible: set[int], turn: Message) -> None:
        """Score the rendering made before ``turn`` (``visible``: results shown in full) on the
        history in ``graph`` (everything before ``turn``)."""
        if turn.role == "assistant" and turn.tool_calls:
            earlier: dict[str, list[int]] = {}
            for m in graph.messages:
                for c in m.tool_calls:
                    key = read_key(c)
                    if key is not None and c.id in graph.result_of:
                        earlier.setdefault(key, []).append(graph.result_of[c.id])
            for c in turn.tool_calls:
                key = read_key(c)
                if key is not None and key in earlier:
                    self.read_repeats += 1
                    self.read_repeats_exposed += not any(r in visible for r in earlier[key])
        if any(p not in visible for p in graph.result_of.values()):
            for p in visible:
                if len(graph.messages[p].content) <= SHORT_CHARS:
                    continue
                age = graph.age(p)
                if age >= RECENT_STEPS:
                    self.full_beyond_recent += 1
                    self.full_old += age > OLD_AGE

    def merge(self, other: "StepsCounts") -> None:
        self.read_repeats += other.read_repeats
        self.read_repeats_exposed += other.read_repeats_exposed
        self.full_beyond_recent += other.full_beyond_recent
        self.full_old += other.full_old

    def columns(self) -> dict[str, Any]:
        """Report columns: repeated reads, exposed repeats and the old-observation share (%)."""
        share = round(100.0 * self.full_old / self.full_beyond_recent, 2) if self.full_beyond_recent else None
        return {"read_repeats": self.read_repeats, "read_repeats_exposed": self.read_repeats_exposed,
                "full_beyond_recent": self.full_beyond_recent, "old_full_share": share}


COLUMNS = ["read_repeats", "read_repeats_exposed", "full_beyond_recent", "old_full_share"]
