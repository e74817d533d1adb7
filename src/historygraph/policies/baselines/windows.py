"""Recency windows over observations: ContextWeaver's sliding window and SWE-agent's masking.

An *observation* is a tool result. Both policies show the ``n`` most recent observations in full
and stand in a short placeholder for every older one; they differ in ``n`` and in what the
placeholder says.

* ``cw-sliding-window`` (ContextWeaver §4, "Baselines"): ``n = 6``, the number of observations
  ContextWeaver keeps in full; older observations get the shared placeholder of
  :mod:`historygraph.render`.
* ``observation-masking`` (SWE-agent's ``LastNObservations`` history processor, cited by
  ContextWeaver §2 and Lindenbauer et al. 2025): ``n = 5``, SWE-agent's default; the placeholder
  states how many lines of output were omitted and names the result id so it can be restored.

Shared rules (docs/architecture.md, invariant §5, :class:`~historygraph.render.Layout`): a history that fits in B is
returned unchanged, so the window applies only when the history exceeds B; a window result that
does not fit in what is left of B is shown as its placeholder too (newest first, like Prune).
"""

from __future__ import annotations

from dataclasses import dataclass

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.render import Layout, Rendering
from historygraph.signals.tokens import TokenCounter
from historygraph.policies.base import Signals
from historygraph.policies.registry import register

MASK = "[old tool result {id}: {lines} lines of output omitted; stored in full and restorable by id]"


def line_count(text: str) -> int:
    """Lines of ``text`` as an editor counts them: ``""`` → 0, a trailing newline ends the last line."""
    return len(text.splitlines())


def mask_placeholder(message: Message, counter: TokenCounter) -> Message:
    """The masking placeholder of one observation (SWE-agent LastNObservations wording, our own text)."""
    return message.with_content(MASK.format(id=message.tool_call_id, lines=line_count(message.content)), "placeholder")


def render_window(name: str, graph: ContextGraph, n: int, layout: Layout) -> Rendering:
    """Show the ``n`` newest results of ``layout`` in full when they fit, newest first; the rest as
    the layout's placeholders. Returns the history unchanged when it fits in B."""
    if layout.fits_in_full:
        return layout.assemble_full(name)
    sel = layout.selection()
    newest = list(reversed(layout.candidates))
    kept = []
    for p in newest[:max(n, 0)]:
        kept.append(sel.fits(p))
        if kept[-1]:
            sel.take(p)

    def fill(reasons: dict[int, str]) -> None:  # per result, when someone reads them
        for rank, p in enumerate(newest):
            if rank >= n:
                reasons[p] = f"omitted: older than the {n} most recent observations"
            elif kept[rank]:
                reasons[p] = f"kept: observation #{rank + 1} from the newest (window n={n})"
            else:
                reasons[p] = f"omitted: in the window (#{rank + 1}) but does not fit in B after newer ones"
    layout.defer_reasons(fill)
    return layout.assemble(name, sel)


@dataclass(frozen=True)
class WindowConfig:
    """``n``: observations (tool results) kept in full, counted from the newest."""

    n: int = 6

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError(f"window config: n must be ≥ 0, got {self.n}")


@register("cw-sliding-window", "ContextWeaver §4 Baselines (sliding window, n = 6)",
          "The n most recent observations in full; older observations replaced by a placeholder.")
class SlidingWindow:
    """ContextWeaver's main baseline (§4, "Baselines"): keep the ``n = 6`` most recent observations
    in full and replace every older one by a placeholder naming its id (see module docstring)."""

    Config = WindowConfig

    def __init__(self, name: str = "cw-sliding-window", config: WindowConfig | None = None) -> None:
        self.name, self.config = name, config or WindowConfig()

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        layout = Layout(graph, signals.counter, budget)
        return render_window(self.name, graph, self.config.n, layout)


@dataclass(frozen=True)
class MaskingConfig:
    """``n``: observations kept in full (SWE-agent's ``last_n_observations`` default, 5)."""

    n: int = 5

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError(f"masking config: n must be ≥ 0, got {self.n}")


@register("observation-masking", "SWE-agent LastNObservations (via ContextWeaver §2, Lindenbauer et al. 2025)",
          "The n most recent observations in full; older ones masked by a line saying how many lines were omitted.")
class ObservationMasking:
    """SWE-agent's default history processor: observations older than the ``n = 5`` most recent are
    masked by a one-line placeholder stating the number of omitted lines (see module docstring)."""

    Config = MaskingConfig

    def __init__(self, name: str = "observation-masking", config: MaskingConfig | None = None) -> None:
        self.name, self.config = name, config or MaskingConfig()

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        layout = Layout(graph, signals.counter, budget, placeholder=mask_placeholder)
        return render_window(self.name, graph, self.config.n, layout)
