"""The prompt-compression algorithms behind the ``*-smollm`` policies, as pure functions of scores.

Written from the papers' descriptions (no code of the released packages is used):

* LLMLingua: Jiang, Wu, Lin, Yang, Qiu, "LLMLingua: Compressing Prompts for Accelerated Inference
  of Large Language Models", EMNLP 2023, arXiv:2310.05736. §3.1 budget controller
  (:func:`budget_controller`), §3.2 iterative token-level prompt compression
  (:func:`iterative_compress`).
* LongLLMLingua: Jiang et al., "LongLLMLingua: Accelerating and Enhancing LLMs in Long Context
  Scenarios via Prompt Compression", arXiv:2310.06839. Question-aware coarse ranking and
  fine-grained contrastive scores (:func:`contrastive`), the compression ratio that falls with the
  rank (:func:`rank_ratios`).
* Selective Context: Li, Dong, Guerin, Lin, "Compressing Context to Enhance Inference Efficiency of
  Large Language Models", EMNLP 2023, arXiv:2310.06201. Self-information of lexical units and the
  percentile filter (:func:`lexical_units`, :func:`unit_information`, :func:`percentile_keep`).

Scores are negative log-likelihoods (nats) of a causal model's tokens
(:mod:`historygraph.signals.perplexity`); token positions are character spans of the text, so a
compressed text is made of verbatim pieces of the original.
"""

from __future__ import annotations

import math
import re
from typing import Callable, Sequence

import numpy as np

Spans = list[tuple[int, int]]


def keep_count(n: int, ratio: float) -> int:
    """Tokens kept of ``n`` at ``ratio`` (kept / original): ``⌈ratio·n⌉``, at least 1 when ``n > 0``."""
    if n <= 0:
        return 0
    return min(n, max(1, math.ceil(ratio * n - 1e-9)))


def select_top(scores: np.ndarray, ratio: float) -> np.ndarray:
    """Boolean mask keeping the ``keep_count(n, ratio)`` highest scores: the tokens at or above the
    threshold γ that meets the target (LLMLingua §3.2 keeps the tokens whose perplexity exceeds a
    threshold chosen for the segment's ratio); ties go to the earlier token."""
    n = len(scores)
    mask = np.zeros(n, dtype=bool)
    k = keep_count(n, ratio)
    if k:
        mask[np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")[:k]] = True
    return mask


def join_kept(text: str, spans: Spans, mask: Sequence[bool] | np.ndarray) -> str:
    """The kept tokens' text, in order (dropped runs leave nothing, as in LLMLingua's output).
    Spans may overlap (a byte-level tokenizer gives every token of a split multi-byte character
    that character's span): a character is emitted at most once, so the result is always a
    subsequence of ``text``."""
    out, end = [], 0
    for (a, b), keep in zip(spans, mask):
        if keep and b > max(a, end):
            out.append(text[max(a, end):b])
            end = b
    return "".join(out)


def budget_controller(perplexity: Sequence[float], sizes: Sequence[int], room: float,
                      k: float) -> tuple[list[int], float, float]:
    """LLMLingua §3.1 (budget controller, demonstration level) with the demonstrations = tool results.

    ``perplexity[i]`` and ``sizes[i]`` (tokens) of each compressible component; ``room``: tokens the
    components may take together. The overall ratio is ``τ = min(1, room / Σ sizes)``; components
    are taken in descending perplexity (the more surprising, the more informative) while their sizes
    sum to at most ``k·τ·Σ sizes`` (``k``: the granular control coefficient, which leaves the
    token-level step the rest of the work); the top one is always taken. Returns
    ``(selected indices in rank order, τ, token-level ratio min(1, room / Σ selected sizes))``.

    Raises:
        ValueError: ``sizes`` and ``perplexity`` differ in length, or ``k < 1``.
    """
    if len(sizes) != len(perplexity):
        raise ValueError(f"{len(perplexity)} perplexities for {len(sizes)} sizes")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    total = float(sum(sizes))
    if total <= 0:
        return list(range(len(sizes))), 1.0, 1.0
    tau = max(0.0, min(1.0, room / total))
    order = sorted(range(len(sizes)), key=lambda i: (-perplexity[i], i))
    chosen: list[int] = []
    used = 0
    for i in order:
        if chosen and used + sizes[i] > k * tau * total:
            break
        chosen.append(i)
        used += sizes[i]
    return chosen, tau, max(0.0, min(1.0, room / used)) if used else 1.0


def segments(spans: Spans, size: int) -> list[tuple[int, int]]:
    """Consecutive token-index ranges ``[(i, j))`` of at most ``size`` tokens."""
    if size < 1:
        raise ValueError(f"segment size must be >= 1, got {size}")
    return [(i, min(i + size, len(spans))) for i in range(0, len(spans), size)]


def iterative_compress(text: str, spans: Spans, ratio: float, segment_tokens: int,
                       score: Callable[[str, str], tuple[Spans, np.ndarray]]) -> str:
    """LLMLingua §3.2, iterative token-level prompt compression of one component.

    ``text`` is split into segments of ``segment_tokens`` of its ``spans``; each segment is scored by
    ``score(segment_text, compressed_prefix)`` (NLL of its tokens given the compressed text of the
    earlier segments, which is what the iteration conditions on) and keeps the
    ``keep_count(n, ratio)`` most surprising tokens (:func:`select_top`). Returns the compressed
    text. The first segment is scored with an empty prefix."""
    out, end = "", 0
    for i, j in segments(spans, segment_tokens):
        a, b = max(spans[i][0], end), spans[j - 1][1]
        if b <= a:
            continue
        end = b
        seg = text[a:b]
        seg_spans, nll = score(seg, out)
        out += join_kept(seg, seg_spans, select_top(nll, ratio))
    return out


def contrastive(nll: np.ndarray, nll_given_question: np.ndarray) -> np.ndarray:
    """LongLLMLingua's contrastive score of each token: ``NLL(x_i | x_<i) − NLL(x_i | q, x_<i)``, how
    much more likely the question makes it (the difference of the two perplexities' logs)."""
    a, b = np.asarray(nll, dtype=np.float64), np.asarray(nll_given_question, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"score arrays differ in shape: {a.shape} and {b.shape}")
    return a - b


def rank_ratios(tau: float, n: int, delta: float, lowest: float) -> list[float]:
    """Per-rank compression ratios (LongLLMLingua, dynamic compression ratio): linear in the rank,
    ``τ + δ/2`` for the best-ranked document down to ``τ − δ/2`` for the last, clipped to
    ``[lowest, 1]`` (a single document gets ``τ``)."""
    if n <= 0:
        return []
    if n == 1:
        return [max(lowest, min(1.0, tau))]
    return [max(lowest, min(1.0, tau + delta * (0.5 - r / (n - 1)))) for r in range(n)]


_WORD = re.compile(r"\s*\S+")
_SENTENCE_END = re.compile(r"[.!?]+(?=\s)|\n")


def lexical_units(text: str, unit: str) -> Spans:
    """Character spans of Selective Context's lexical units of ``text``: ``"phrase"`` = a word
    (a run of non-space characters with the spaces before it; the paper's noun-phrase chunker
    needs spaCy, which is not available here), ``"sentence"`` = up to the next ``.``, ``!``, ``?``
    followed by a space, or the end of a line (tool output is line-oriented). ``"token"`` units
    are the scorer's tokens and are not built here.

    Raises:
        ValueError: an unknown ``unit``.
    """
    if unit == "phrase":
        return [(m.start(), m.end()) for m in _WORD.finditer(text)]
    if unit != "sentence":
        raise ValueError(f"unit must be 'phrase' or 'sentence' here, got {unit!r}")
    cuts = [0] + [m.end() for m in _SENTENCE_END.finditer(text)] + [len(text)]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def unit_information(spans: Spans, nll: np.ndarray, units: Spans) -> np.ndarray:
    """Self-information of each unit in bits: the sum of ``nll / ln 2`` over the tokens that start
    inside it (Selective Context §2: a unit's self-information is the sum over its tokens)."""
    bits = np.asarray(nll, dtype=np.float64) / math.log(2)
    starts = np.array([a for a, _ in units])
    out = np.zeros(len(units))
    for (a, _), v in zip(spans, bits):
        u = int(np.searchsorted(starts, a, side="right")) - 1
        if u >= 0:
            out[u] += v
    return out


def percentile_keep(info: np.ndarray, ratio: float) -> np.ndarray:
    """Selective Context's filter: drop the units whose self-information lies below the
    ``100·(1 − ratio)``-th percentile of the units' values (numpy's linear interpolation); the
    others are kept. ``ratio`` is the share of units meant to remain."""
    info = np.asarray(info, dtype=np.float64)
    if info.size == 0:
        return np.zeros(0, dtype=bool)
    return info >= np.percentile(info, 100.0 * (1.0 - ratio))


def snap(ratio: float, ladder: Sequence[float]) -> float:
    """The largest ladder value at most ``ratio`` (the smallest one below them all; 1.0 when
    ``ratio >= 1``): compressed forms are computed and cached only at these ratios."""
    if ratio >= 1.0:
        return 1.0
    below = [r for r in ladder if r <= ratio + 1e-12]
    return max(below) if below else min(ladder)
