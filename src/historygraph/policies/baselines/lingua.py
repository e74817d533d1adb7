"""Small-model prompt compression of tool results: LLMLingua, LongLLMLingua and Selective Context.

ReCAP §4 compares with LLMLingua-2 and LongLLMLingua, ContextWeaver §2 discusses Selective Context.
Their released compressors download models at run time; these policies implement the published
algorithms (:mod:`historygraph.policies.baselines.compression`) with the small causal model that ships here,
**SmolLM2-135M-Instruct** (:mod:`historygraph.signals.perplexity`), instead of the papers'
LLaMA-2-7B (LLMLingua, LongLLMLingua) or GPT-2 / LLaMA (Selective Context). LLMLingua-2 (Pan et
al., 2024, arXiv:2403.12968) is a token classifier trained on GPT-4 compressions; without its
trained weights it cannot run here and is not registered: ``llmlingua-smollm`` is LLMLingua (the
first paper), not LLMLingua-2.

What is compressed: the tool results (the bulk of an agent's history; the papers' demonstrations
or documents). Everything else renders as for every policy (:class:`~historygraph.render.Layout`):
system and current user messages outside B, user and assistant messages verbatim (LLMLingua's
budget controller keeps the instruction and the question; here they are never compressed), a
history that fits in B unchanged. A compressed result is a new form of the result, a tool message
marked ``rendered_as="compressed"`` whose first line names the result id, the method, the model and
how many of its tokens are kept; it never counts as a complete result (ContextRender B.4). Results
that do not fit even compressed become placeholders naming their id.

Budget (the papers fix a target ratio; ours derives it from B): the results may take
``room = B − (retained non-tool history, placeholders and markers) + Σ placeholders`` tokens; the
target ratio is ``room / L`` with ``L`` the results' compressible size (their tokens, at most
``max_result_tokens``). Ratios are snapped down to a fixed ladder (``ratios``), so that a result's
compressed form is computed once per ladder step and cached.

Cost bounds (ours, for a CPU model on a shared machine):

* a result longer than ``max_result_tokens = 512`` scorer tokens is scored and compressed on its
  first two thirds and last third of that many tokens, joined by ``"…"`` (the marker still gives
  its full size);
* at most ``max_new_per_render = 8`` results per render are newly scored or compressed (cache
  misses); a result beyond the cap is left as a placeholder for this render, with that reason, and
  is compressed at a later render.

Caches (by content hash, in the store when the signals carry one, else in the policy instance):
token NLLs per (scorer, scored text, context) under kind ``"lingua-nll"`` (shared by the three
policies), compressed texts per (method, ratio, scored text, question) under ``"lingua-text"``.
Compressing the same result at the same ratio twice makes no model call. Every forward pass is
charged as a model call (tokens read, 0 output tokens, seconds) in ``Rendering.stats`` like the
summarising policies (ContextRender C.2).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Literal

import numpy as np

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.models.chat import Completion, ModelUsage
from historygraph.render import COMPRESSED_GAP, COMPRESSED_PREFIX, Layout, Rendering, Selection
from historygraph.policies.base import Signals
from historygraph.policies.registry import register
from historygraph.policies.baselines.compression import (budget_controller, contrastive, iterative_compress, join_kept, lexical_units,
                          percentile_keep, rank_ratios, select_top, snap, unit_information)
from historygraph.policies.baselines.summary import usage_stats

SCORE_VERSION = "lingua-v1"  # token NLLs
TEXT_VERSION = "lingua-text-v2"  # compressed texts (v2: overlapping token spans emitted once)
COMPRESSED_MARK = COMPRESSED_PREFIX + ("{method} with {model}: {kept} of {total} tokens kept; "
                                      "the full result is stored and can be restored by id]\n")
REGION_JOIN = COMPRESSED_GAP


class _NeedsModel(Exception):
    """A cache miss after the per-render cap of new compressions was reached."""


class _Work:
    """One render's access to the scorer: content-hash caches, usage, the per-render cap."""

    def __init__(self, signals: Signals, memo: dict[str, str], usage: ModelUsage, cap: int) -> None:
        self.signals, self.memo, self.usage, self.cap = signals, memo, usage, cap
        self.touched: set[int] = set()
        self.allow = True
        self._scorer: Any = None

    @property
    def scorer(self) -> Any:
        if self._scorer is None:
            self._scorer = self.signals.scorer
        return self._scorer

    def key(self, *parts: Any) -> str:
        version = TEXT_VERSION if parts and parts[0] == "text" else SCORE_VERSION
        return hashlib.sha256(json.dumps([self.scorer.name, version, *parts]).encode("utf-8", "surrogatepass")).hexdigest()

    def get(self, kind: str, key: str) -> str | None:
        store = self.signals.store
        return store.get_text(kind, key) if store is not None else self.memo.get(key)

    def put(self, kind: str, key: str, value: str) -> None:
        store = self.signals.store
        if store is not None:
            store.put_text(kind, key, value)
        else:
            self.memo[key] = value

    def attempt(self, p: int, fn: Callable[[], Any]) -> Any:
        """``fn()`` for result ``p``, or ``None`` when it needs the model and the cap is reached
        (the cap counts results that needed the model in this render, each once)."""
        before = self.usage.calls
        self.allow = p in self.touched or len(self.touched) < self.cap
        try:
            return fn()
        except _NeedsModel:
            return None
        finally:
            if self.usage.calls > before:
                self.touched.add(p)

    def nll(self, text: str, context: str = "") -> tuple[list[tuple[int, int]], np.ndarray]:
        """Spans and NLL of ``text`` given ``context`` (cached; a miss runs the scorer and is charged)."""
        if not text:
            return [], np.zeros(0)
        k = self.key("nll", text, context)
        hit = self.get("lingua-nll", k)
        if hit is not None:
            d = json.loads(hit)
            return [tuple(s) for s in d["spans"]], np.array(d["nll"], dtype=np.float64)
        if not self.allow:
            raise _NeedsModel
        s = self.scorer.score(text, context)
        self.usage.add(Completion("", s.input_tokens, 0, s.seconds))
        self.put("lingua-nll", k, json.dumps({"spans": [list(x) for x in s.spans],
                                              "nll": [round(float(v), 5) for v in s.nll]}))
        return list(s.spans), np.asarray(s.nll, dtype=np.float64)

    def region(self, text: str, max_tokens: int) -> str:
        """The scored part of a result (module docstring): all of it, or head ⅔ and tail ⅓ of ``max_tokens``."""
        tokenize = self.scorer.tokenize
        chars = 16 * max_tokens
        if len(text) <= chars and len(tokenize(text)) <= max_tokens:
            return text
        h = max_tokens * 2 // 3
        t = max_tokens - h
        head_spans = tokenize(text[:chars])[:h]
        tail_text = text[-chars:]
        tail_spans = tokenize(tail_text)[-t:]
        head_end = head_spans[-1][1] if head_spans else 0
        tail_start = len(text) - len(tail_text) + (tail_spans[0][0] if tail_spans else len(tail_text))
        return text[:head_end] + REGION_JOIN + text[max(head_end, tail_start):]


def _check_common(cfg: Any, what: str) -> None:
    r = cfg.ratios
    if not r or any(not 0 < x < 1 for x in r) or list(r) != sorted(r, reverse=True):
        raise ValueError(f"{what} config: ratios must be decreasing values in (0, 1), got {r}")
    if cfg.max_result_tokens < 16 or cfg.max_new_per_render < 1:
        raise ValueError(f"{what} config: max_result_tokens >= 16 and max_new_per_render >= 1 are required")


class CompressingPolicy:
    """Base of the three policies: layout, budget, the greedy fill with compressed forms.

    Subclasses set ``Config``, ``method`` (the paper's name, shown in the marker) and implement
    :meth:`plan` (which results to offer, in order, each with its target ratio) and
    :meth:`compress` (the compressed text of a scored region at a ratio)."""

    Config: type
    method: str

    def __init__(self, name: str, config: Any = None) -> None:
        self.name, self.config = name, config or self.Config()
        self._memo: dict[str, str] = {}

    # -- to implement ------------------------------------------------------------------------
    def plan(self, layout: Layout, graph: ContextGraph, work: _Work, room: int,
             size: dict[int, int]) -> tuple[list[tuple[int, float]], dict[int, str]]:
        """``([(position, ratio)] in the order to offer them, reasons of those not offered)``."""
        raise NotImplementedError

    def compress(self, work: _Work, region: str, ratio: float, graph: ContextGraph) -> str:
        raise NotImplementedError

    def cache_parts(self, graph: ContextGraph) -> list[Any]:
        """What besides the method, ratio and text a compressed form depends on (LongLLMLingua: the question)."""
        return []

    # -- shared ------------------------------------------------------------------------------
    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        layout = Layout(graph, signals.counter, budget)
        usage = ModelUsage()
        if layout.fits_in_full:
            r = layout.assemble_full(self.name)
            r.stats.update(usage_stats(usage))
            return r
        work = _Work(signals, self._memo, usage, self.config.max_new_per_render)
        sel = self.fill(layout, graph, work)
        r = layout.assemble(self.name, sel)
        r.stats.update(usage_stats(usage))
        r.stats["compressed"] = sum(1 for m in r.messages if m.rendered_as == "compressed")
        return r

    def fill(self, layout: Layout, graph: ContextGraph, work: _Work) -> Selection:
        assert layout.budget is not None
        cands = layout.candidates
        size = {p: min(layout.full_cost[p], self.config.max_result_tokens) for p in cands}
        room = layout.budget - layout.base_tokens + sum(layout.placeholder_tokens[p] for p in cands)
        offers, reasons = self.plan(layout, graph, work, room, size)
        layout.reasons.update(reasons)
        sel = layout.selection()
        ladder = self.config.ratios
        for p, ratio in offers:
            original = graph.messages[p]
            tried: list[str] = []
            r = snap(ratio, ladder)
            steps = [r] + [x for x in ladder if x < r][:1]  # one step lower when the first does not fit
            for x in steps:
                form = original if x >= 1.0 else work.attempt(p, functools.partial(self.form, work, original, x, graph, layout))
                if form is None:
                    tried.append("not compressed in this render (per-render cap of new compressions reached)")
                    break
                if form is not original and layout.counter.count_message(form) >= layout.full_cost[p]:
                    form = original  # the marker makes a short result's compressed form no smaller
                if sel.fits(p, form):
                    sel.take(p, form)
                    layout.reasons[p] = ("kept: complete (no smaller compressed form)" if form is original else
                                         f"compressed by {self.method} at ratio {x} (target {ratio:.3f})")
                    break
                tried.append(f"ratio {x}: does not fit in B" if x < 1.0 else "complete: does not fit in B")
            if p not in sel.shown:
                layout.reasons[p] = "omitted: " + "; ".join(tried)
        return sel

    def form(self, work: _Work, original: Message, ratio: float, graph: ContextGraph, layout: Layout) -> Message:
        """The compressed form of ``original`` at ``ratio`` (cached by content hash)."""
        region = work.region(original.content, self.config.max_result_tokens)
        key = work.key("text", self.method, self.config_key(), ratio, region, *self.cache_parts(graph))
        text = work.get("lingua-text", key)
        if text is None:
            text = self.compress(work, region, ratio, graph)
            work.put("lingua-text", key, text)
        counter = layout.counter
        head = COMPRESSED_MARK.format(id=original.tool_call_id, method=self.method, model=work.scorer.name,
                                      kept=counter.count(text), total=counter.count(original.content))
        return original.with_content(head + text, "compressed")

    def config_key(self) -> list[Any]:
        c = self.config
        return [c.max_result_tokens, getattr(c, "segment_tokens", None), getattr(c, "unit", None)]

    def perplexity(self, work: _Work, p: int, graph: ContextGraph) -> float | None:
        """exp(mean NLL) of result ``p``'s scored region (``None``: not scored, cap reached)."""
        region = work.region(graph.messages[p].content, self.config.max_result_tokens)
        got = work.attempt(p, lambda: work.nll(region))
        if got is None:
            return None
        nll = got[1]
        return float(math.exp(min(50.0, nll.mean()))) if len(nll) else 1.0


# -- LLMLingua ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LLMLinguaConfig:
    """LLMLingua (arXiv:2310.05736) with SmolLM2-135M. ``k``: granular control coefficient of the
    budget controller (§3.1; 2 is ours: demonstrations may fill twice the target before the token
    step); ``segment_tokens``: segment length of the iterative compression (§3.2; 200 ours);
    ``ratios``, ``max_result_tokens``, ``max_new_per_render``: module docstring."""

    k: float = 2.0
    segment_tokens: int = 200
    ratios: tuple[float, ...] = (0.8, 0.5, 0.33, 0.2, 0.1, 0.05)
    max_result_tokens: int = 512
    max_new_per_render: int = 8

    def __post_init__(self) -> None:
        _check_common(self, "llmlingua-smollm")
        if self.k < 1 or self.segment_tokens < 1:
            raise ValueError("llmlingua-smollm config: k >= 1 and segment_tokens >= 1 are required")


def _scored_newest_first(policy: CompressingPolicy, layout: Layout, graph: ContextGraph,
                         work: _Work) -> tuple[dict[int, float], dict[int, str]]:
    """Perplexity of every candidate, newest first, so the cap leaves the oldest unscored."""
    ppl, reasons = {}, {}
    for p in reversed(layout.candidates):
        v = policy.perplexity(work, p, graph)
        if v is None:
            reasons[p] = "omitted: not scored in this render (per-render cap of new compressions reached)"
        else:
            ppl[p] = v
    return ppl, reasons


@register("llmlingua-smollm", "LLMLingua (Jiang et al., EMNLP 2023, arXiv:2310.05736) §3.1–3.2, compressor "
          "SmolLM2-135M-Instruct instead of LLaMA-2-7B; not LLMLingua-2 (arXiv:2403.12968, a trained classifier "
          "that cannot run here)",
          "Tool results ranked by the small model's perplexity (budget controller), the kept ones compressed "
          "token by token, segment by segment, to fit B.")
class LLMLinguaSmolLM(CompressingPolicy):
    """LLMLingua's budget controller and iterative token-level compression over the tool results.

    Budget controller (§3.1): the results are the demonstrations; instruction and question (here:
    all non-tool history) are kept. Results are ranked by the perplexity of their scored region,
    highest first, and taken while their sizes stay within ``k·τ·L`` (:func:`budget_controller`);
    the others become placeholders. Each taken result is compressed at the token-level ratio
    ``room / Σ taken sizes`` by iterative token-level compression (§3.2,
    :func:`iterative_compress`): segments of ``segment_tokens`` tokens, each scored given the
    compressed earlier segments, keeping its most surprising tokens. Not implemented: the
    distribution alignment of §3.3 (instruction-tuning the small model on the target model's
    outputs). Compressor: SmolLM2-135M-Instruct, not the paper's LLaMA-2-7B."""

    Config = LLMLinguaConfig
    method = "LLMLingua"

    def __init__(self, name: str = "llmlingua-smollm", config: LLMLinguaConfig | None = None) -> None:
        super().__init__(name, config)

    def plan(self, layout: Layout, graph: ContextGraph, work: _Work, room: int,
             size: dict[int, int]) -> tuple[list[tuple[int, float]], dict[int, str]]:
        ppl, reasons = _scored_newest_first(self, layout, graph, work)
        ps = sorted(ppl)
        chosen, tau, tau_tok = budget_controller([ppl[p] for p in ps], [size[p] for p in ps], room, self.config.k)
        picked = [ps[i] for i in chosen]
        for p in set(ps) - set(picked):
            reasons[p] = f"omitted: below the budget controller's perplexity cut (τ = {tau:.3f}, k = {self.config.k})"
        return [(p, tau_tok) for p in picked], reasons

    def compress(self, work: _Work, region: str, ratio: float, graph: ContextGraph) -> str:
        spans = work.scorer.tokenize(region)
        return iterative_compress(region, spans, ratio, self.config.segment_tokens, work.nll)


# -- LongLLMLingua --------------------------------------------------------------------------------

@dataclass(frozen=True)
class LongLLMLinguaConfig:
    """LongLLMLingua (arXiv:2310.06839) with SmolLM2-135M. ``k``: share of the target the coarse
    ranking may keep before the token step (as LLMLingua's §3.1, 2 ours); ``delta``: width of the
    rank-dependent ratio (the best-ranked result gets τ + δ/2, the last τ − δ/2; 0.3 ours);
    ``question_tokens``: head of the question scored (64 ours); the rest as LLMLingua's."""

    k: float = 2.0
    delta: float = 0.3
    question_tokens: int = 64
    ratios: tuple[float, ...] = (0.8, 0.5, 0.33, 0.2, 0.1, 0.05)
    max_result_tokens: int = 512
    max_new_per_render: int = 8

    def __post_init__(self) -> None:
        _check_common(self, "longllmlingua-smollm")
        if self.k < 1 or not 0 <= self.delta <= 1 or self.question_tokens < 1:
            raise ValueError("longllmlingua-smollm config: k >= 1, 0 <= delta <= 1 and question_tokens >= 1 are required")


def question_of(graph: ContextGraph) -> str:
    """The request a LongLLMLingua compression is conditioned on: the latest user message, else
    the latest assistant message (text and tool calls). Production signals only."""
    for m in reversed(graph.messages):
        if m.role == "user" and m.content.strip():
            return m.content
    for m in reversed(graph.messages):
        if m.role == "assistant":
            return m.content + "".join(f"\n{c.name}({c.arguments})" for c in m.tool_calls)
    return ""


@register("longllmlingua-smollm", "LongLLMLingua (Jiang et al., arXiv:2310.06839), compressor "
          "SmolLM2-135M-Instruct instead of LLaMA-2-7B; question = the latest user message",
          "Tool results ranked by how much they raise the small model's likelihood of the request, then "
          "compressed token by token by contrastive perplexity, less the lower they rank.")
class LongLLMLinguaSmolLM(CompressingPolicy):
    """LongLLMLingua's question-aware coarse-to-fine compression over the tool results.

    The question is the request (:func:`question_of`, the latest user message as in ReCAP §4,
    first ``question_tokens`` scorer tokens). Fine-grained scores are contrastive
    (:func:`contrastive`): each token's NLL without the question minus its NLL with the question
    before the result. Coarse ranking: the paper ranks documents by the NLL of the question given
    the document; we rank by the result's summed contrastive score, ``log p(d | q) − log p(d)``,
    which equals ``log p(q | d) − log p(q)`` for a consistent joint distribution, and ``log p(q)``
    is the same for every document, so the order is that of ``p(q | d)`` while reusing the two
    passes the fine step needs (no third pass, hence no restrict prompt; the small model is only
    approximately consistent). Results are taken in rank order within ``k·τ·L``; the token ratio of
    the taken ones falls linearly with the rank (:func:`rank_ratios`). Not implemented: document
    reordering (the rendering keeps chronological order, docs/architecture.md, invariant §5.3) and subsequence recovery
    (it post-processes the answer). The token step keeps the highest contrastive scores of the
    whole scored region in one pass, not segment by segment. Compressor: SmolLM2-135M-Instruct,
    not the paper's LLaMA-2-7B."""

    Config = LongLLMLinguaConfig
    method = "LongLLMLingua"

    def __init__(self, name: str = "longllmlingua-smollm", config: LongLLMLinguaConfig | None = None) -> None:
        super().__init__(name, config)

    def question(self, work: _Work, graph: ContextGraph) -> str:
        q = question_of(graph)
        spans = work.scorer.tokenize(q[:16 * self.config.question_tokens])[:self.config.question_tokens]
        return q[:spans[-1][1]] if spans else ""

    def cache_parts(self, graph: ContextGraph) -> list[Any]:
        return [question_of(graph), self.config.question_tokens]

    def scores(self, work: _Work, region: str, question: str) -> np.ndarray:
        _, plain = work.nll(region)
        _, given = work.nll(region, question + "\n") if question else (None, plain)
        return contrastive(plain, given)

    def plan(self, layout: Layout, graph: ContextGraph, work: _Work, room: int,
             size: dict[int, int]) -> tuple[list[tuple[int, float]], dict[int, str]]:
        q = self.question(work, graph)
        gain, reasons = {}, {}
        for p in reversed(layout.candidates):
            region = work.region(graph.messages[p].content, self.config.max_result_tokens)
            got = work.attempt(p, functools.partial(self.scores, work, region, q))
            if got is None:
                reasons[p] = "omitted: not scored in this render (per-render cap of new compressions reached)"
            else:
                gain[p] = float(got.sum())
        ps = sorted(gain)
        chosen, tau, tau_tok = budget_controller([gain[p] for p in ps], [size[p] for p in ps], room, self.config.k)
        picked = [ps[i] for i in chosen]
        for p in set(ps) - set(picked):
            reasons[p] = f"omitted: ranked below the coarse cut by relevance to the request (τ = {tau:.3f})"
        ratios = rank_ratios(tau_tok, len(picked), self.config.delta, min(self.config.ratios))
        return list(zip(picked, ratios)), reasons

    def compress(self, work: _Work, region: str, ratio: float, graph: ContextGraph) -> str:
        spans, _ = work.nll(region)
        return join_kept(region, spans, select_top(self.scores(work, region, self.question(work, graph)), ratio))


# -- Selective Context ----------------------------------------------------------------------------

@dataclass(frozen=True)
class SelectiveContextConfig:
    """Selective Context (arXiv:2310.06201) with SmolLM2-135M. ``unit``: lexical unit filtered
    (``token``, ``phrase`` = word, ``sentence`` = sentence or line; ``phrase`` default, the paper's
    best-performing granularity); the rest as LLMLingua's."""

    unit: Literal["token", "phrase", "sentence"] = "phrase"
    ratios: tuple[float, ...] = (0.8, 0.5, 0.33, 0.2, 0.1, 0.05)
    max_result_tokens: int = 512
    max_new_per_render: int = 8

    def __post_init__(self) -> None:
        _check_common(self, "selective-context-smollm")
        if self.unit not in ("token", "phrase", "sentence"):
            raise ValueError(f"selective-context-smollm config: unit must be token, phrase or sentence, got {self.unit!r}")


def selective_text(text: str, spans: list[tuple[int, int]], nll: np.ndarray, ratio: float, unit: str) -> str:
    """Selective Context on one text: the units at or above the ``100·(1 − ratio)``-th percentile
    of self-information, in order (:func:`percentile_keep`)."""
    if unit == "token":
        return join_kept(text, spans, percentile_keep(nll, ratio))
    units = lexical_units(text, unit)
    return join_kept(text, units, percentile_keep(unit_information(spans, nll, units), ratio))


@register("selective-context-smollm", "Selective Context (Li et al., EMNLP 2023, arXiv:2310.06201), "
          "self-information from SmolLM2-135M-Instruct instead of GPT-2 / LLaMA",
          "Each tool result loses its lowest self-information words (or tokens, or sentences) down to the "
          "ratio that fits B, newest results first.")
class SelectiveContextSmolLM(CompressingPolicy):
    """Selective Context over the tool results: every result is compressed at the one ratio
    ``room / L`` that makes them fit together, by dropping its lexical units of lowest
    self-information (:func:`selective_text`); the paper compresses the whole context at one
    ratio and has no budget controller, so when compressed results still exceed B they are
    offered newest first (ours) and the rest become placeholders. Self-information comes from
    SmolLM2-135M-Instruct, not the paper's GPT-2 / LLaMA."""

    Config = SelectiveContextConfig
    method = "Selective Context"

    def __init__(self, name: str = "selective-context-smollm", config: SelectiveContextConfig | None = None) -> None:
        super().__init__(name, config)

    def plan(self, layout: Layout, graph: ContextGraph, work: _Work, room: int,
             size: dict[int, int]) -> tuple[list[tuple[int, float]], dict[int, str]]:
        total = sum(size.values())
        tau = min(1.0, room / total) if total else 1.0
        return [(p, tau) for p in reversed(layout.candidates)], {}

    def compress(self, work: _Work, region: str, ratio: float, graph: ContextGraph) -> str:
        spans, nll = work.nll(region)
        return selective_text(region, spans, nll, ratio, self.config.unit)
