"""ContextWeaver: keep the observations the current step depends on, summarise the rest.

Source: ContextWeaver, "ContextWeaver: Selective and Dependency-Structured Memory Construction for LLM Agents" §3.1 (node extraction, parent selection,
ancestry, weaving), §3.3 (validation layer, low-cost configuration), §5.5 and Table 4 (selection
ablations), Appendix F.1 (test summary) and F.2 (parent analyzer).

Rendering one invocation (``render(graph, B, signals)``):

1. If the complete history fits in B it is returned unchanged (docs/architecture.md, invariant §5.5).
2. The steps view (:mod:`historygraph.signals.steps`) gives every thought–action–observation
   node with files, identifiers, test results, validation status and parents. The *current step*
   ``N_k`` is the latest assistant message.
3. **Full observations** (§3.1 "Context Weaving", §3.3 "Low-cost configuration"): the current step
   and the two before it (``recent_steps = 3``), plus the ancestry of ``N_k``: breadth-first up the
   parent edges until ``W = max_ancestors = 3`` earlier observations are collected (the paper keeps
   "three earlier observations in full", §5.5). While the session has at most
   ``recent_steps + W`` steps (the warm-up W sets, §3.1) every step counts as an ancestor.
   Ablations (Table 4) replace the ancestry by the ``W`` most recent earlier steps
   (``selection="recency"``) or ``W`` random earlier steps (``selection="random"``, seeded by the
   session id and ``k``).
4. **Other observations** keep their thought and action; the observation is replaced by its node
   summary (at most ``summary_chars = 300`` characters, written by ``signals.model``, cached by
   content hash in ``signals.store`` kind ``"summary"``) marked ``rendered_as="summary"`` and naming
   the result id, or, in the placeholder variant (``summaries="none"``) and wherever no summary
   fits, by the shared placeholder naming the result id (Appendix C). A result no longer than
   ``summary_chars`` is its own summary and is shown as is, without a model call; so is one whose
   summary would cost at least as many tokens as the result.
5. **Budget** (shared :class:`~historygraph.render.Layout` accounting): a result that costs no
   more than its placeholder is shown in full first (ours: it frees budget). Then, in tiers, each
   result while it fits: the recent window in full (newest first), the ancestors in full (newest
   first), the other steps' short results (their own summaries, newest first), the summaries of
   recent and ancestor results that did not fit in full, and last the model summaries of the other
   steps (newest first, stopping at the first that does not fit). A result larger than B alone is
   shown as a head-and-tail excerpt of B/4 tokens. So every observation shown in full is admitted
   before any summary (ours: the order is what §3.1's weaving implies when B binds), and over B the
   summaries are dropped first and the ancestors last, oldest first; each drop is a reason.
6. ``rendering.stats`` carries the current step, its parents and ancestry, the validation counts,
   the F.1 test summary (to be prepended to the agent's next input by the caller, since the policy
   never alters stored messages) and the model usage of this rendering.

Parent selectors: ``parents="lowcost"`` (shared files, identifiers, recency; the configuration the
paper evaluates) or ``parents="llm"`` (the Appendix F.2 analyzer, :mod:`.contextweaver_analyzer`),
which falls back to the low-cost choice when the model's answer cannot be parsed.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, fields

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.models.chat import ModelUsage
from historygraph.render import Layout, Rendering, Selection
from historygraph.signals.steps.features import Step
from historygraph.signals.steps.parents import ParentScoring, lowcost_selector
from historygraph.signals.steps.view import ancestry, build_steps, lowcost_steps
from historygraph.signals.test_output import TestTracker
from historygraph.policies.base import Signals
from historygraph.policies.registry import register
from historygraph.policies.baselines.summary import usage_stats

SOURCE = "ContextWeaver §3.1, §3.3, F.1, F.2"
SUMMARY = "[summary of tool result {id}; the full result ({tokens} tokens) is stored and can be restored by id] {text}"
SUMMARY_SYSTEM = ("You write short memory notes about the steps of a coding agent. Given one command and what it "
                  "printed, say in one or two plain sentences what the output shows: the files, functions, values, "
                  "errors or test outcomes in it. Stay under 300 characters. No preamble.")
SUMMARY_PROMPT_VERSION = "cw-summary-1"
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class ContextWeaverConfig:
    """Parameters; defaults from ContextWeaver §3.3 and §5.5 unless marked ours.

    Attributes:
        max_ancestors: W, earlier observations kept in full through the dependency graph (§5.5: 3).
        recent_steps: the current step and the two before it, always full (§3.3: 3).
        selection: ``dependency`` (ancestry), ``recency`` or ``random`` (Table 4 ablations).
        parents: ``lowcost`` or ``llm`` (F.2 analyzer).
        summaries: ``model`` (node summaries from ``signals.model``) or ``none`` (placeholders).
        summary_chars: the summary limit in characters (§3.3: 300).
        summary_max_tokens: generation limit of one summary call (ours).
        summary_input_chars: observation characters shown to the summariser, head 3/4 and tail 1/4 (ours).
        max_parents, w_files, w_identifiers, w_recency, recency_decay: the low-cost score (ours).
        oversized_excerpt_fraction: excerpt size for a result larger than B, as a share of B
            (ContextRender A.4's fallback, shared policy behaviour).
        seed: seed of the random ablation.
    """

    max_ancestors: int = 3
    recent_steps: int = 3
    selection: str = "dependency"
    parents: str = "lowcost"
    summaries: str = "model"
    summary_chars: int = 300
    summary_max_tokens: int = 64
    summary_input_chars: int = 1500
    max_parents: int = 3
    w_files: float = 1.0
    w_identifiers: float = 0.5
    w_recency: float = 1.0
    recency_decay: float = 0.8
    oversized_excerpt_fraction: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        choices = {"selection": ("dependency", "recency", "random"), "parents": ("lowcost", "llm"),
                   "summaries": ("model", "none")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"ContextWeaver config: {name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        for name in ("max_ancestors", "recent_steps", "summary_chars", "max_parents", "summary_max_tokens"):
            if getattr(self, name) < (0 if name == "max_ancestors" else 1):
                raise ValueError(f"ContextWeaver config: {name} is too small ({getattr(self, name)})")
        if not 0 < self.oversized_excerpt_fraction <= 1:
            raise ValueError("ContextWeaver config: oversized_excerpt_fraction must be in (0, 1]")

    @property
    def scoring(self) -> ParentScoring:
        names = {f.name for f in fields(ParentScoring)}
        return ParentScoring(**{n: getattr(self, n) for n in names})


def clean_summary(text: str, limit: int) -> str:
    """One line, at most ``limit`` characters, cut at a word boundary when possible."""
    text = _SPACE.sub(" ", text).strip()
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    if " " in cut[limit // 2:]:
        cut = cut[:cut.rfind(" ")]
    return cut.rstrip(" ,;:") + "…"


_MEMO: dict[str, str] = {}  # summary cache when signals.store is None
_MEMO_MAX = 50_000          # entries; the in-process cache is emptied when it reaches this size


class Summarizer:
    """Node summaries from ``signals.model``, cached by content hash (store kind ``"summary"``).

    ``usage`` sums the model calls made (cache hits cost nothing).
    """

    def __init__(self, signals: Signals, cfg: ContextWeaverConfig) -> None:
        self.signals, self.cfg = signals, cfg
        self.usage = ModelUsage()

    def prompt(self, step: Step, observation: str) -> list[dict[str, str]]:
        n = self.cfg.summary_input_chars
        shown = observation if len(observation) <= n else (
            observation[:3 * n // 4] + "\n[...]\n" + observation[-(n // 4):])
        return [{"role": "system", "content": SUMMARY_SYSTEM},
                {"role": "user", "content": f"Command:\n{step.action[:500]}\n\nOutput:\n{shown}"}]

    def summary(self, step: Step, observation: str) -> str:
        """The cleaned summary text (``""`` when the model returned nothing usable)."""
        model = self.signals.model
        messages = self.prompt(step, observation)
        key = hashlib.sha256("\x00".join([SUMMARY_PROMPT_VERSION, model.name, str(self.cfg.summary_max_tokens)]
                                         + [m["content"] for m in messages]).encode()).hexdigest()
        store = self.signals.store
        text = store.get_text("summary", key) if store is not None else _MEMO.get(key)
        if text is None:
            c = model.complete(messages, max_tokens=self.cfg.summary_max_tokens)
            self.usage.add(c)
            text = clean_summary(c.text, self.cfg.summary_chars)
            if store is not None:
                store.put_text("summary", key, text)
            else:
                if len(_MEMO) >= _MEMO_MAX:
                    _MEMO.clear()
                _MEMO[key] = text
        return text


class ContextWeaver:
    """The ContextWeaver policy (see module docstring)."""

    Config = ContextWeaverConfig

    def __init__(self, name: str = "contextweaver", config: ContextWeaverConfig | None = None) -> None:
        self.name = name
        self.config = config or ContextWeaverConfig()

    # -- steps and the full set -----------------------------------------------------------
    def steps(self, graph: ContextGraph, signals: Signals) -> list[Step]:
        cfg = self.config
        if cfg.parents == "llm":
            from historygraph.policies.contextweaver.analyzer import llm_selector

            low = lowcost_selector(cfg.scoring)
            return build_steps(graph, llm_selector(graph, signals, low, cfg.max_parents), f"llm:{signals.model.name}")
        return lowcost_steps(graph, cfg.scoring)

    def earlier_full(self, graph: ContextGraph, steps: list[Step]) -> list[int]:
        """Step indices outside the recent window whose observations are kept in full, in the order
        of their importance (ancestry BFS order, or the ablation's order)."""
        cfg = self.config
        k = len(steps) - 1
        recent = set(range(max(0, k - cfg.recent_steps + 1), k + 1))
        earlier = [i for i in range(k) if i not in recent and steps[i].results]
        if len(steps) <= cfg.recent_steps + cfg.max_ancestors:
            return earlier[::-1]
        if cfg.selection == "recency":
            return earlier[::-1][:cfg.max_ancestors]
        if cfg.selection == "random":
            rng = random.Random(f"{cfg.seed}:{graph.session_id}:{k}")
            return rng.sample(earlier, min(cfg.max_ancestors, len(earlier)))
        return [i for i in ancestry(steps, k, cfg.max_ancestors, recent) if i not in recent and steps[i].results]

    # -- rendering ------------------------------------------------------------------------
    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        cfg = self.config
        layout = Layout(graph, signals.counter, budget, excerpt_fraction=cfg.oversized_excerpt_fraction)
        if layout.fits_in_full or not any(m.role == "assistant" for m in graph.messages):
            return layout.assemble_full(self.name)
        steps = self.steps(graph, signals)
        k = len(steps) - 1
        recent = list(range(k, max(-1, k - cfg.recent_steps), -1))  # newest first
        anc_set = set(self.earlier_full(graph, steps))
        summarizer = Summarizer(signals, cfg) if cfg.summaries == "model" else None
        sel = layout.selection()
        weaver = _Weave(layout, sel, signals, cfg, summarizer)
        weaver.free_results()
        for i in recent:
            weaver.full(steps[i], "recent window (current step and the two before it)")
        for i in sorted(anc_set, reverse=True):
            role = (f"an ancestor of the current step {k} (message {steps[k].position})" if cfg.selection == "dependency"
                    else f"chosen by {cfg.selection} instead of dependency (Table 4 ablation)")
            weaver.full(steps[i], f"step {i} (message {steps[i].position}): {role}")
        others = [s for s in reversed(steps) if s.index not in anc_set and s.index not in recent and s.results]
        weaver.short_results(others)
        weaver.fallback_summaries()
        weaver.summaries(others)
        r = layout.assemble(self.name, sel)
        tracker = TestTracker()
        for s in steps:
            tracker.observe(s.test_results)
        statuses = [s.validation_status for s in steps]
        r.stats.update({
            "current_step": k, "parents": list(steps[k].parents), "earlier_full": sorted(anc_set),
            "validation": {st: statuses.count(st) for st in ("passed", "failed", "unknown", "superseded")},
            "test_summary": tracker.summary(),
            **usage_stats(summarizer.usage if summarizer else ModelUsage()),
        })
        return r


class _Weave:
    """Admission of results into one :class:`Selection` in the tier order of the module docstring."""

    def __init__(self, layout: Layout, sel: Selection, signals: Signals, cfg: ContextWeaverConfig,
                 summarizer: Summarizer | None) -> None:
        self.layout, self.sel, self.signals, self.cfg, self.summarizer = layout, sel, signals, cfg, summarizer
        assert layout.budget is not None  # with no budget the history always fits: the render returned it whole
        self.budget: int = layout.budget
        self.summaries_closed = False
        self.missed: list[tuple[Step, int, str]] = []  # full results that did not fit, in tier order
        self.short: set[int] = set()  # other steps' results short enough to be their own summary

    def _try(self, p: int, shown: Message, reason: str) -> bool:
        if not self.sel.fits(p, shown):
            return False
        self.sel.take(p, shown)
        self.layout.reasons[p] = reason
        return True

    def summary_message(self, step: Step, p: int) -> Message | None:
        """The summary stand-in for result ``p`` (``None`` in the placeholder variant or when empty)."""
        m = self.layout.graph.messages[p]
        if self.summarizer is None:
            return None
        text = self.summarizer.summary(step, m.content)
        if not text:
            return None
        step.summary = text
        return m.with_content(SUMMARY.format(id=m.tool_call_id, tokens=self.signals.counter.count(m.content), text=text),
                              "summary")

    def free_results(self) -> None:
        """Show in full, before any tier, every result that costs no more than its placeholder
        (ours: such a result is its own summary and showing it frees budget for the tiers)."""
        lay = self.layout
        for p in lay.candidates:
            m = lay.graph.messages[p]
            if lay.form[p] is m and self.sel.cost(p) <= 0:
                self.sel.take(p)
                lay.reasons[p] = "full: no larger than its placeholder"

    def full(self, step: Step, why: str) -> None:
        """Show ``step``'s results in full (a result larger than B as the shared excerpt); one that
        does not fit waits for :meth:`fallback_summaries`."""
        lay = self.layout
        for p in step.results:
            if p in self.sel.shown:
                continue
            m = lay.graph.messages[p]
            if lay.form[p] is not m:  # larger than B: the shared excerpt fallback
                if self._try(p, lay.form[p], f"excerpt: result larger than B; {why}"):
                    continue
            elif self._try(p, m, f"full: {why}"):
                continue
            self.missed.append((step, p, why))

    def short_results(self, others: list[Step]) -> None:
        """The other steps' results no longer than ``summary_chars`` (each its own, exact summary),
        newest first, each while it fits."""
        lay = self.layout
        for step in others:
            for p in step.results:
                if p not in self.sel.shown and len(lay.graph.messages[p].content) <= self.cfg.summary_chars:
                    self.short.add(p)
                    if not self._try(p, lay.graph.messages[p], "full: short result is its own summary"):
                        lay.reasons[p] = (f"placeholder: short, but its {self.sel.cost(p)} tokens exceed the "
                                          f"{self.budget - self.sel.used} left of B after the recent window and ancestors")

    def fallback_summaries(self) -> None:
        """Summaries of the recent and ancestor results that did not fit in full, in tier order."""
        for step, p, why in self.missed:
            s = self.summary_message(step, p)
            if s is None or not self._try(p, s, f"summary: full result over B; {why}"):
                self.layout.reasons[p] = f"placeholder: neither the full result nor its summary fits in B; {why}"

    def summaries(self, others: list[Step]) -> None:
        """Model summaries of the other steps' long results, newest first, until the first that
        does not fit (so over B they are dropped first, oldest first)."""
        lay = self.layout
        for step in others:
            for p in step.results:
                if p in self.sel.shown or p in self.short:
                    continue
                m = lay.graph.messages[p]
                if self.summaries_closed:
                    lay.reasons[p] = "placeholder: summary dropped, over B (summaries are dropped oldest first)"
                    continue
                if self.summarizer is None:
                    lay.reasons[p] = "placeholder: not in the ancestry (placeholder variant)"
                    continue
                s = self.summary_message(step, p)
                if s is not None and self.sel.cost(p, s) >= self.sel.cost(p, m):  # the summary would cost more
                    s = m
                if s is None:
                    lay.reasons[p] = "placeholder: the model returned no summary"
                elif self._try(p, s, "summary: not in the ancestry" if s is not m else "full: cheaper than its summary"):
                    continue
                else:
                    self.summaries_closed = True
                    lay.reasons[p] = "placeholder: summary dropped, over B (summaries are dropped oldest first)"


register("contextweaver", SOURCE, "Current step, the two before it and W=3 dependency ancestors in full; other "
         "observations as model-written node summaries (≤300 chars); validation from test output.")(ContextWeaver)
register("contextweaver-placeholder", SOURCE, "ContextWeaver with placeholders instead of node summaries (no model).",
         summaries="none")(ContextWeaver)
register("contextweaver-llm", SOURCE + " (full framework)", "ContextWeaver with parents chosen by the LLM analyzer "
         "(Appendix F.2) instead of the low-cost score.", parents="llm")(ContextWeaver)
register("contextweaver-recency", "ContextWeaver §5.5, Table 4 (recency)", "ContextWeaver keeping the W most recent "
         "earlier observations in full instead of the ancestry.", selection="recency")(ContextWeaver)
register("contextweaver-random", "ContextWeaver §5.5, Table 4 (random)", "ContextWeaver keeping W random earlier "
         "observations in full instead of the ancestry.", selection="random")(ContextWeaver)
