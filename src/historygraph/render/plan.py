"""The agent's execution state: the latest todo list or plan it wrote, which every rendering shows
(docs/architecture.md, invariant §5.10).

Coding agents keep their plan in a tool call whose arguments are the whole current list, each call
superseding the one before: Claude Code's ``TodoWrite`` (Anthropic's Claude Code documentation,
"Tools available to Claude": creates and manages structured task lists; arguments
``{"todos": [{"content", "status", "activeForm"}, …]}``) and the OpenAI Codex CLI's
``update_plan`` (its plan tool; arguments ``{"plan": [{"step", "status"}, …]}``, an optional
``explanation``). Their results only acknowledge the call ("Todos have been modified
successfully…", "Plan updated"), so the state is the assistant message that made the latest such
call, with its arguments. Older versions are superseded and need not be shown.
"""

from __future__ import annotations

import threading

from historygraph.history.graph import ContextGraph

#: Names of the tools whose latest call holds the agent's whole plan (module docstring).
PLAN_TOOLS = frozenset({"TodoWrite", "update_plan"})
_LATEST = "render.plan.latest"  # graph.memo key: [messages scanned, latest plan position or None, lock]


def latest_plan(graph: ContextGraph) -> int | None:
    """Position of the assistant message that made the graph's latest call to a tool of
    :data:`PLAN_TOOLS`, ``None`` when it has none. O(messages appended since the last call): the
    graph is append-only, so the scan resumes where it stopped (kept per graph)."""
    state: list = graph.memo(_LATEST, lambda: [0, None, threading.Lock()])
    msgs = graph.messages
    with state[2]:
        for p in range(state[0], len(msgs)):
            if msgs[p].role == "assistant" and any(c.name in PLAN_TOOLS for c in msgs[p].tool_calls):
                state[1] = p
        state[0] = max(state[0], len(msgs))
        return state[1]
