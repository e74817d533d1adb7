"""Tool-result clearing: the cheap rules agents and providers use to keep a prompt cache, as replay
policies priced like every other (issue 49, item 5).

Each rule replaces old tool results by the render layer's placeholder (naming the id, so nothing
is lost, docs/architecture.md, invariant §5.3) and never clears the results the next call answers
(§5.9). Their point is the cache: a result once cleared stays cleared, so the prompt only changes
where the rule clears something new, and the rest of the time each request extends the previous one.

* ``clear-tool-uses``: Anthropic's server-side context editing, strategy ``clear_tool_uses_20250919``
  (Anthropic's documentation, "Context editing", tool result clearing). Documented parameters and
  defaults: ``trigger`` 100,000 input tokens, ``keep`` 3 tool uses, ``clear_at_least`` none,
  ``exclude_tools`` none, ``clear_tool_inputs`` false. Once the prompt passes the trigger the API
  clears the oldest tool results first and keeps the ``keep`` most recent tool uses; a tool named in
  ``exclude_tools`` is never cleared; when the clearing would free fewer than ``clear_at_least``
  tokens it is not applied. The edit is server-side: the client keeps sending its full history, so
  the rule is applied to each request as a function of the full history (our reading: the
  documentation describes no state kept between requests). Here ``trigger`` defaults to B (the
  replay's budget, history tokens) instead of 100,000. ``clear_tool_inputs`` (clearing the call's
  arguments too) is not offered: it rewrites assistant messages, which §5.3 keeps verbatim.
* ``microcompact``: Claude Code's microcompact (introduced in Claude Code 1.0.68, its release
  notes; "What is Micro-Compact", claudelog.com): old results of the compactable tools are replaced
  by a cleared marker, the 5 most recent compactable ones kept. It runs in the client and edits
  the history it keeps, so it is stateful: it fires when the history, with what it cleared before,
  passes the trigger (here B), and then clears every compactable result but the ``keep`` newest.
  ``compactable`` names the tools (Claude Code: Read, Bash, Grep, Glob, WebSearch, WebFetch, Edit,
  Write); empty (the default) makes every tool compactable, so the rule applies to any agent.
* ``low-watermark``: when the history, with what was cleared before, passes ``threshold`` (B by
  default), clear the oldest results until it is at most ``low_mark·threshold`` (half by default),
  never the newest ones: hysteresis, so the prompt changes once per firing, not at every call.

Shared rules (ours): a result no longer than its placeholder is never cleared (clearing it would
lengthen the prompt); a history that fits in B comes back unchanged (§5.5); when the rule's history
is still over B (its kept results or the non-tool history too large), the shared
:class:`~historygraph.render.Layout` holds B as for every policy: oldest steps dropped, the results
the rule keeps shown newest first while they fit. The stateful rules keep their cleared set per
graph, per policy instance and per budget (:meth:`~historygraph.history.graph.ContextGraph.memo`).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from historygraph.history.graph import ContextGraph
from historygraph.policies.base import Signals
from historygraph.policies.registry import register
from historygraph.render import Layout, Rendering

_TOOL_NAMES = "clearing.tool_names"  # graph.memo key: {result position: its call's tool name}


def tool_name(graph: ContextGraph, p: int) -> str:
    """The name of the tool whose call the result at position ``p`` answers ("" when unknown)."""
    names: dict[int, str] = graph.memo(_TOOL_NAMES, dict)
    if p not in names:
        owner, cid = graph.owner_of.get(p), graph.messages[p].tool_call_id
        calls = graph.messages[owner].tool_calls if owner is not None else ()
        names[p] = next((c.name for c in calls if c.id == cid), "")
    return names[p]


def clearable(layout: Layout) -> list[int]:
    """The layout's candidates a rule may clear, oldest first: not a newest result (§5.9) and
    longer than their placeholder."""
    full, ph, required = layout.full_cost, layout.placeholder_tokens, layout.required
    newest = newest_results(layout)
    return [p for p in layout.candidates if p not in required and p not in newest and full[p] > ph[p]]


def newest_results(layout: Layout) -> set[int]:
    """Positions of the results of the latest assistant message's calls (§5.9)."""
    graph, last = layout.graph, layout.last_assistant
    if last is None:
        return set()
    return {q for c in graph.messages[last].tool_calls if (q := graph.result_of.get(c.id)) is not None}


def saved(layout: Layout, positions: AbstractSet[int] | list[int]) -> int:
    """Tokens the history loses when the results at ``positions`` are shown as placeholders."""
    full, ph = layout.full_cost, layout.placeholder_tokens
    return sum(full[p] - ph[p] for p in positions)


def render_cleared(name: str, layout: Layout, cleared: AbstractSet[int], why: str) -> Rendering:
    """The history with the results in ``cleared`` as placeholders and every other result complete,
    through ``layout`` (its budget held: results not cleared taken newest first while they fit).
    ``why`` is the reason recorded for a cleared result."""
    if layout.fits_in_full:
        return layout.assemble_full(name)
    sel = layout.selection()
    shown = []
    for p in reversed(layout.candidates):
        if p not in cleared and sel.fits(p):
            sel.take(p)
            shown.append(p)
    kept = set(shown)
    cands = layout.candidates

    def fill(reasons: dict[int, str]) -> None:
        for p in cands:
            if p in cleared:
                reasons[p] = why
            elif p in kept:
                reasons[p] = f"kept: not cleared by {name}"
            else:
                reasons[p] = f"omitted: not cleared by {name}, but does not fit in B after newer results"
    layout.defer_reasons(fill)
    r = layout.assemble(name, sel)
    r.stats["cleared"] = len(cleared)
    return r


class _Stateful:
    """The per-graph, per-budget cleared set of a rule that edits the history it keeps."""

    def __init__(self) -> None:
        self._key = object()

    def cleared(self, graph: ContextGraph, budget: int) -> set[int]:
        state: dict[int, set[int]] = graph.memo(("clearing", self._key), dict)
        return state.setdefault(budget, set())


@dataclass(frozen=True)
class ClearToolUsesConfig:
    """``trigger``: history tokens above which the rule applies (``None``: B; Anthropic's default
    100,000 input tokens); ``keep``: most recent tool uses kept (Anthropic's default 3);
    ``clear_at_least``: fewest tokens a clearing must free, else nothing is cleared (0: no minimum,
    Anthropic's default none); ``exclude_tools``: tool names never cleared (default none)."""

    trigger: int | None = None
    keep: int = 3
    clear_at_least: int = 0
    exclude_tools: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.trigger is not None and self.trigger < 0:
            raise ValueError(f"clear-tool-uses config: trigger must be ≥ 0 tokens, got {self.trigger}")
        if self.keep < 0:
            raise ValueError(f"clear-tool-uses config: keep must be ≥ 0 tool uses, got {self.keep}")
        if self.clear_at_least < 0:
            raise ValueError(f"clear-tool-uses config: clear_at_least must be ≥ 0 tokens, got {self.clear_at_least}")


@register("clear-tool-uses", "Anthropic's documentation, Context editing (clear_tool_uses_20250919)",
          "Anthropic's server-side tool result clearing: over the trigger (B), every result but the 3 most recent "
          "tool uses replaced by a placeholder.")
class ClearToolUses:
    """Anthropic's ``clear_tool_uses_20250919`` context edit applied to each request's full history
    (module docstring)."""

    Config = ClearToolUsesConfig

    def __init__(self, name: str = "clear-tool-uses", config: ClearToolUsesConfig | None = None) -> None:
        self.name, self.config = name, config or ClearToolUsesConfig()

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        layout = Layout(graph, signals.counter, budget)
        cfg = self.config
        trigger = cfg.trigger if cfg.trigger is not None else budget
        cleared: set[int] = set()
        if trigger is not None and layout.full_history_tokens > trigger:
            results = layout.candidates
            recent = set(results[len(results) - cfg.keep:]) if cfg.keep else set()
            excluded = set(cfg.exclude_tools)
            chosen = [p for p in clearable(layout) if p not in recent and tool_name(graph, p) not in excluded]
            if chosen and saved(layout, chosen) >= cfg.clear_at_least:
                cleared = set(chosen)
        return render_cleared(self.name, layout, cleared,
                              f"cleared: older than the {cfg.keep} most recent tool uses, history over the trigger")


@dataclass(frozen=True)
class MicrocompactConfig:
    """``keep``: most recent compactable results kept (Claude Code: 5); ``trigger``: history tokens,
    with earlier clearings, above which it fires (``None``: B); ``compactable``: tool names whose
    results it clears (empty: every tool)."""

    keep: int = 5
    trigger: int | None = None
    compactable: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.keep < 0:
            raise ValueError(f"microcompact config: keep must be ≥ 0 results, got {self.keep}")
        if self.trigger is not None and self.trigger < 0:
            raise ValueError(f"microcompact config: trigger must be ≥ 0 tokens, got {self.trigger}")


@register("microcompact", "Claude Code microcompact (release notes 1.0.68; 5 most recent compactable results kept)",
          "Claude Code's microcompact: when the history passes B, every compactable result but the 5 newest cleared; "
          "cleared results stay cleared.")
class Microcompact(_Stateful):
    """Claude Code's microcompact, firing when the history it keeps passes the trigger (module docstring)."""

    Config = MicrocompactConfig

    def __init__(self, name: str = "microcompact", config: MicrocompactConfig | None = None) -> None:
        super().__init__()
        self.name, self.config = name, config or MicrocompactConfig()

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        layout = Layout(graph, signals.counter, budget)
        cfg = self.config
        trigger = cfg.trigger if cfg.trigger is not None else budget
        if budget is None or trigger is None:
            return render_cleared(self.name, layout, set(), "")
        cleared = self.cleared(graph, budget)
        if layout.full_history_tokens - saved(layout, cleared) > trigger:
            wanted = set(cfg.compactable)
            compactable = [p for p in layout.candidates if not wanted or tool_name(graph, p) in wanted]
            recent = set(compactable[len(compactable) - cfg.keep:]) if cfg.keep else set()
            allowed = set(clearable(layout))
            cleared.update(p for p in compactable if p not in recent and p in allowed)
        return render_cleared(self.name, layout, frozenset(cleared),
                              f"cleared by microcompact: older than the {cfg.keep} most recent compactable results")


@dataclass(frozen=True)
class LowWatermarkConfig:
    """``threshold``: history tokens, with earlier clearings, above which it fires (``None``: B);
    ``low_mark``: the share of ``threshold`` the oldest results are cleared down to (0 < low_mark ≤ 1)."""

    threshold: int | None = None
    low_mark: float = 0.5

    def __post_init__(self) -> None:
        if self.threshold is not None and self.threshold < 0:
            raise ValueError(f"low-watermark config: threshold must be ≥ 0 tokens, got {self.threshold}")
        if not 0.0 < self.low_mark <= 1.0:
            raise ValueError(f"low-watermark config: low_mark must be in (0, 1], got {self.low_mark}")


@register("low-watermark", "ours: threshold clearing with hysteresis, as agents that keep their prompt cache do",
          "When the history passes B, the oldest results cleared until it is at most half of B, never the newest; "
          "cleared results stay cleared.")
class LowWatermark(_Stateful):
    """Clear the oldest results down to ``low_mark·threshold`` when the history passes ``threshold``
    (module docstring)."""

    Config = LowWatermarkConfig

    def __init__(self, name: str = "low-watermark", config: LowWatermarkConfig | None = None) -> None:
        super().__init__()
        self.name, self.config = name, config or LowWatermarkConfig()

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        layout = Layout(graph, signals.counter, budget)
        cfg = self.config
        threshold = cfg.threshold if cfg.threshold is not None else budget
        if budget is None or threshold is None:
            return render_cleared(self.name, layout, set(), "")
        cleared = self.cleared(graph, budget)
        history = layout.full_history_tokens - saved(layout, cleared)
        if history > threshold:
            low = cfg.low_mark * threshold
            full, ph = layout.full_cost, layout.placeholder_tokens
            for p in clearable(layout):
                if history <= low:
                    break
                if p not in cleared:
                    cleared.add(p)
                    history -= full[p] - ph[p]
        return render_cleared(self.name, layout, frozenset(cleared),
                              f"cleared by low-watermark: oldest results cleared down to {cfg.low_mark:g} of the threshold")
