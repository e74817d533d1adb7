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
  replay's budget, history tokens) instead of 100,000 (a trigger counted in tool uses, which the API
  also takes, is not offered). ``clear_tool_inputs`` (clearing the call's arguments too) is not
  offered: it rewrites assistant messages, which §5.3 keeps verbatim.
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
lengthen the prompt); a history that fits in B comes back unchanged (§5.5). When the rule's history
is still over B (the results it keeps, or the non-tool history, too large), the oldest steps are
left out, behind the layout's dropped-step marker (§5.6), until it is at most ``DROP_TO·B`` (or the
low mark of ``low-watermark``), and they stay left out: the same hysteresis as the rule, so the
prompt changes only when that fires too (without it, the shared layout's oldest-first drop moves at
every call: on the 14 mini-swe-agent trajectories at B = 6000, half of the calls of every rule were
over B after clearing, and 546–684 of 1,071 requests did not extend the previous one). Whatever is
left, :class:`~historygraph.render.Layout` holds B as for every policy: the results the rule keeps
shown newest first while they fit. The cleared results of the stateful rules and the steps left out
are kept per graph, per policy instance and per budget
(:meth:`~historygraph.history.graph.ContextGraph.memo`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from historygraph.history.graph import ContextGraph
from historygraph.policies.base import Signals
from historygraph.policies.registry import register
from historygraph.render import Layout, Rendering

DROP_TO = 0.5
"""When the history is still over B after a rule cleared what it may, the oldest steps are left out
until it is at most this share of B: the share of B the shared layout keeps for the non-tool history
(:class:`~historygraph.render.Layout`, ``result_reserve`` 0.5)."""

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


def kept_tokens(layout: Layout, cleared: AbstractSet[int]) -> int:
    """History tokens of ``layout``'s history with the results in ``cleared`` as placeholders, the
    others complete and the steps it leaves out gone (dropped-step markers not counted; the layout
    holds B whatever this estimate says)."""
    costs = layout.unit_costs
    out = int(costs.sum()) - sum(int(costs[i]) for i in layout.left_out)
    delta = layout.delta
    return out + sum(delta[p] for p in layout.candidates if p not in cleared)


class Rule(ABC):
    """A clearing rule rendered through the shared layout, with the steps it leaves out kept per
    graph and budget (module docstring); a subclass says which results are cleared (:meth:`clear`)
    and, when it has one, the low mark the oldest steps are left out down to (:meth:`drop_to`)."""

    name: str

    def __init__(self) -> None:
        self._key = object()

    def state(self, graph: ContextGraph, budget: int) -> dict[str, set[int]]:
        """This rule's state on ``graph`` at ``budget``: ``cleared`` results and ``omit`` (the first
        position of each step left out)."""
        states: dict[int, dict[str, set[int]]] = graph.memo(("clearing", self._key), dict)
        return states.setdefault(budget, {"cleared": set(), "omit": set()})

    @abstractmethod
    def clear(self, layout: Layout, state: dict[str, set[int]], budget: int) -> set[int]:
        """The results this call shows as placeholders (a stateful rule adds to ``state["cleared"]``)."""

    def drop_to(self, budget: int) -> float:
        return DROP_TO * budget

    @abstractmethod
    def why(self) -> str:
        """The reason recorded for a cleared result."""

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        if budget is None:
            return Layout(graph, signals.counter, None).assemble_full(self.name)
        state = self.state(graph, budget)
        layout = Layout(graph, signals.counter, budget, omit=state["omit"])
        if layout.fits_in_full:
            return layout.assemble_full(self.name)
        cleared = self.clear(layout, state, budget)
        if set(layout.dropped_units) - set(layout.left_out) or kept_tokens(layout, cleared) > budget:
            self._leave_out_oldest(layout, cleared, state, self.drop_to(budget))
            layout = Layout(graph, signals.counter, budget, omit=state["omit"])
            cleared = self.clear(layout, state, budget)
        return render_cleared(self.name, layout, cleared, self.why())

    @staticmethod
    def _leave_out_oldest(layout: Layout, cleared: AbstractSet[int], state: dict[str, set[int]], target: float) -> None:
        """Add to ``state["omit"]`` the oldest steps ``layout`` does not protect or leave out yet,
        until the kept history (:func:`kept_tokens`) is at most ``target``."""
        shown: dict[int, int] = {}
        delta, unit_of = layout.delta, layout.unit_of
        for p in layout.candidates:
            if p not in cleared:
                shown[unit_of[p]] = shown.get(unit_of[p], 0) + delta[p]
        history = kept_tokens(layout, cleared)
        costs, units = layout.unit_costs, layout.units
        for i in range(len(units)):
            if history <= target:
                break
            u = units[i]
            if u.protected or i in layout.left_out:
                continue
            state["omit"].add(u.positions[0])
            history -= int(costs[i]) + shown.get(i, 0)


def saved(layout: Layout, positions: AbstractSet[int] | list[int]) -> int:
    """Tokens the history loses when the results at ``positions`` are shown as placeholders."""
    full, ph = layout.full_cost, layout.placeholder_tokens
    return sum(full[p] - ph[p] for p in positions)


def render_cleared(name: str, layout: Layout, cleared: AbstractSet[int], why: str) -> Rendering:
    """The history with the results in ``cleared`` as placeholders and every other result complete,
    through ``layout`` (its budget held: results not cleared taken newest first while they fit).
    ``why`` is the reason recorded for a cleared result."""
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
class ClearToolUses(Rule):
    """Anthropic's ``clear_tool_uses_20250919`` context edit applied to each request's full history
    (module docstring)."""

    Config = ClearToolUsesConfig

    def __init__(self, name: str = "clear-tool-uses", config: ClearToolUsesConfig | None = None) -> None:
        super().__init__()
        self.name, self.config = name, config or ClearToolUsesConfig()

    def clear(self, layout: Layout, state: dict[str, set[int]], budget: int) -> set[int]:
        cfg = self.config
        trigger = cfg.trigger if cfg.trigger is not None else budget
        if layout.full_history_tokens <= trigger:
            return set()
        results = layout.graph.results()  # every tool use of the full history, as the server sees it
        recent = set(results[len(results) - cfg.keep:]) if cfg.keep else set()
        excluded = set(cfg.exclude_tools)
        chosen = [p for p in clearable(layout) if p not in recent and tool_name(layout.graph, p) not in excluded]
        return set(chosen) if chosen and saved(layout, chosen) >= cfg.clear_at_least else set()

    def why(self) -> str:
        return f"cleared: older than the {self.config.keep} most recent tool uses, history over the trigger"


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
class Microcompact(Rule):
    """Claude Code's microcompact, firing when the history it keeps passes the trigger (module docstring)."""

    Config = MicrocompactConfig

    def __init__(self, name: str = "microcompact", config: MicrocompactConfig | None = None) -> None:
        super().__init__()
        self.name, self.config = name, config or MicrocompactConfig()

    def clear(self, layout: Layout, state: dict[str, set[int]], budget: int) -> set[int]:
        cfg, cleared, graph = self.config, state["cleared"], layout.graph
        trigger = cfg.trigger if cfg.trigger is not None else budget
        if kept_tokens(layout, cleared) > trigger:
            wanted = set(cfg.compactable)
            compactable = [p for p in graph.results() if not wanted or tool_name(graph, p) in wanted]
            recent = set(compactable[len(compactable) - cfg.keep:]) if cfg.keep else set()
            allowed = set(clearable(layout))
            cleared.update(p for p in compactable if p not in recent and p in allowed)
        return cleared

    def why(self) -> str:
        return f"cleared by microcompact: older than the {self.config.keep} most recent compactable results"


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
class LowWatermark(Rule):
    """Clear the oldest results down to ``low_mark·threshold`` when the history passes ``threshold``
    (module docstring)."""

    Config = LowWatermarkConfig

    def __init__(self, name: str = "low-watermark", config: LowWatermarkConfig | None = None) -> None:
        super().__init__()
        self.name, self.config = name, config or LowWatermarkConfig()

    def _threshold(self, budget: int) -> int:
        return self.config.threshold if self.config.threshold is not None else budget

    def clear(self, layout: Layout, state: dict[str, set[int]], budget: int) -> set[int]:
        cleared = state["cleared"]
        history = kept_tokens(layout, cleared)
        threshold = self._threshold(budget)
        if history > threshold:
            low = self.config.low_mark * threshold
            delta = layout.delta
            for p in clearable(layout):
                if history <= low:
                    break
                if p not in cleared:
                    cleared.add(p)
                    history -= delta[p]
        return cleared

    def drop_to(self, budget: int) -> float:
        return self.config.low_mark * min(budget, self._threshold(budget))

    def why(self) -> str:
        return f"cleared by low-watermark: oldest results cleared down to {self.config.low_mark:g} of the threshold"
