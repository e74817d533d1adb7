"""The summarising baselines of ContextRender B.2 and ContextWeaver §4.

All four share :class:`~historygraph.policies.baselines.summary.CondensingPolicy`: a chain of summaries,
each merging the previous one with newly condensed history, made only at invocations where the
view exceeds B, cached by content hash, with every model call's tokens and seconds reported
(module docstring of :mod:`historygraph.policies.baselines.summary`). They differ in their trigger:

* ``compact-llm`` (ContextRender B.2, Compact (LLM)): when the view exceeds B, the whole
  condensable view (everything but the first user message, the current user message and the
  current turn) is compressed into the summary.
* ``recency-summary`` (ContextRender B.2, Recency + Summary): when the view exceeds B, the oldest
  units are summarised until the rest fits in ``recent_share · B`` (0.5; our value: the paper only
  says both must fit in B, and leaving half of B for new results keeps the summariser from running
  at every turn); recent results stay complete.
* ``cw-llm-summary`` (ContextWeaver §4, LLM summarization in the style of the OpenHands
  condenser): once the view holds more than ``max_observations = 10`` observations, everything but
  the units holding the ``keep_observations = 5`` most recent observations is condensed (the
  OpenHands condenser keeps half of its maximum view).
* ``cw-hybrid`` (ContextWeaver §4, the hybrid of Lindenbauer et al. 2025): observation masking
  with a window of the last ``window = 10`` observations (older ones get the line-count
  placeholder of ``observation-masking``); when ``trigger_turns = 53`` turns have accumulated in
  the view, the oldest ``summarize_turns = 43`` are summarised.

Summary sizes (``max_summary_tokens = 24`` model tokens, prompts of ``prompt_chars = 1200``
characters of history) are ours, chosen so that the local CPU model stays usable (about 10 s per call
on a busy 2-core machine); the papers used API models and give no sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from historygraph.history.graph import ContextGraph
from historygraph.render import Layout, Selection
from historygraph.policies.base import Signals
from historygraph.policies.registry import register
from historygraph.policies.baselines.summary import CondensingPolicy, View
from historygraph.policies.baselines.windows import mask_placeholder


class SummarySizes(Protocol):
    """A summarising baseline's config, as far as :func:`check_summary` reads it."""

    @property
    def max_summary_tokens(self) -> int: ...

    @property
    def prompt_chars(self) -> int: ...


def check_summary(cfg: SummarySizes) -> None:
    if cfg.max_summary_tokens < 1 or cfg.prompt_chars < 80:
        raise ValueError("summary config: max_summary_tokens ≥ 1 and prompt_chars ≥ 80 are required")


@dataclass(frozen=True)
class CompactConfig:
    """Summariser output cap (model tokens) and prompt size (characters); see module docstring."""

    max_summary_tokens: int = 24
    prompt_chars: int = 1200

    def __post_init__(self) -> None:
        check_summary(self)


@register("compact-llm", "ContextRender B.2 (Compact (LLM))",
          "When the history exceeds B, an LLM compresses all of it (merged with the previous summary).")
class CompactLLM(CondensingPolicy):
    """Compact (LLM) of ContextRender B.2: the whole condensable view becomes the summary."""

    Config = CompactConfig

    def __init__(self, name: str = "compact-llm", config: CompactConfig | None = None) -> None:
        super().__init__(name, config)

    def plan(self, view: View, budget: int, graph: ContextGraph) -> int:
        return len(view.units)


@dataclass(frozen=True)
class RecencySummaryConfig:
    """``recent_share``: share of B the unsummarised recent history may keep after a summary."""

    recent_share: float = 0.5
    max_summary_tokens: int = 24
    prompt_chars: int = 1200

    def __post_init__(self) -> None:
        check_summary(self)
        if not 0 < self.recent_share <= 1:
            raise ValueError(f"recency-summary config: recent_share must be in (0, 1], got {self.recent_share}")


@register("recency-summary", "ContextRender B.2 (Recency + Summary)",
          "Recent results complete; older ones summarised, each summary merged with the previous one.")
class RecencySummary(CondensingPolicy):
    """Recency + Summary of ContextRender B.2 (module docstring)."""

    Config = RecencySummaryConfig

    def __init__(self, name: str = "recency-summary", config: RecencySummaryConfig | None = None) -> None:
        super().__init__(name, config)

    def plan(self, view: View, budget: int, graph: ContextGraph) -> int:
        rest, i = view.tokens, 0
        while i < len(view.units) and rest > self.config.recent_share * budget:
            rest -= view.unit_tokens[i]
            i += 1
        return i


@dataclass(frozen=True)
class CondenserConfig:
    """OpenHands-style condenser: condense above ``max_observations``, keep ``keep_observations``."""

    max_observations: int = 10
    keep_observations: int = 5
    max_summary_tokens: int = 24
    prompt_chars: int = 1200

    def __post_init__(self) -> None:
        check_summary(self)
        if not 0 <= self.keep_observations <= self.max_observations:
            raise ValueError("cw-llm-summary config: 0 ≤ keep_observations ≤ max_observations is required")


def units_before_last_observations(view: View, graph: ContextGraph, keep: int) -> int:
    """How many leading view units to condense so that the kept units (and the current turn) hold
    at least the ``keep`` most recent observations of the view."""
    msgs = graph.messages
    seen = view.observations - sum(msgs[p].role == "tool" for u in view.units for p in u)  # current turn's
    i = len(view.units)
    while i > 0 and seen < keep:
        i -= 1
        seen += sum(msgs[p].role == "tool" for p in view.units[i])
    return i


@register("cw-llm-summary", "ContextWeaver §4 Baselines (LLM summarization, OpenHands condenser)",
          "Once more than 10 observations are in view, older history is condensed into a merged summary.")
class LLMSummaryCondenser(CondensingPolicy):
    """ContextWeaver's LLM-summarization baseline in the style of the OpenHands condenser."""

    Config = CondenserConfig

    def __init__(self, name: str = "cw-llm-summary", config: CondenserConfig | None = None) -> None:
        super().__init__(name, config)

    def plan(self, view: View, budget: int, graph: ContextGraph) -> int:
        if view.observations <= self.config.max_observations:
            return 0
        return units_before_last_observations(view, graph, self.config.keep_observations)


@dataclass(frozen=True)
class HybridConfig:
    """Lindenbauer et al. (2025) via ContextWeaver §4: masking window 10, summarise 43 of 53 turns."""

    window: int = 10
    trigger_turns: int = 53
    summarize_turns: int = 43
    max_summary_tokens: int = 24
    prompt_chars: int = 1200

    def __post_init__(self) -> None:
        check_summary(self)
        if self.window < 0 or not 0 < self.summarize_turns <= self.trigger_turns:
            raise ValueError("cw-hybrid config: window ≥ 0 and 0 < summarize_turns ≤ trigger_turns are required")


@register("cw-hybrid", "ContextWeaver §4 Baselines (hybrid of Lindenbauer et al. 2025)",
          "Observation masking (last 10 in full) plus an LLM summary of the oldest 43 turns whenever 53 accumulate.")
class Hybrid(CondensingPolicy):
    """The masking + summarisation hybrid of Lindenbauer et al. (2025), as ContextWeaver ran it."""

    Config = HybridConfig

    def __init__(self, name: str = "cw-hybrid", config: HybridConfig | None = None) -> None:
        super().__init__(name, config)

    def plan(self, view: View, budget: int, graph: ContextGraph) -> int:
        if view.turns < self.config.trigger_turns:
            return 0
        msgs, turns = graph.messages, 0
        for i, u in enumerate(view.units):
            turns += msgs[u[0]].role == "assistant"
            if turns == self.config.summarize_turns:
                return i + 1
        return len(view.units)

    def layout(self, graph: ContextGraph, signals: Signals, budget: int | None, **kw) -> Layout:  # noqa: ANN003
        return Layout(graph, signals.counter, budget, placeholder=mask_placeholder, **kw)

    def fill(self, layout: Layout, graph: ContextGraph) -> Selection:
        sel = layout.selection()
        for rank, p in enumerate(reversed(layout.candidates)):
            if rank < self.config.window and sel.fits(p):
                sel.take(p)
                layout.reasons[p] = f"kept: observation #{rank + 1} from the newest (window {self.config.window})"
            else:
                layout.reasons[p] = f"masked: outside the window of {self.config.window} or over B"
        return sel
