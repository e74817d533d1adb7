"""Inference cost of a policy on recorded traces: ContextRender eq. 3 with C.1/C.2 normalisation.

ContextRender (arXiv 2609.37743) §4.2 eq. 3 prices one task's tokens in USD per million tokens::

    C = ([p_in·(1 − ρ) + p_cached·ρ]·P + p_out·O + p_emb·E) / 10^6

with the paper's reference prices p_in = 2, p_cached = 0.5, p_out = 8, p_emb = 0.13
(:class:`Prices`). Per policy and trace (C.2, "Token usage"):

* ``P``: input tokens of every model call: the complete model input of each agent invocation
  (tool schemas where the trace has them, system prompt, rendered history, current message;
  ``Rendering.input_tokens``) plus the input tokens of every summariser or analyser call the policy
  made (``model_input_tokens``);
* ``O``: output tokens: the recorded assistant turn of each invocation (the replayed model's output
  is the recorded one for every policy) plus the summariser/analyser outputs;
* ``E``: embedding tokens: each distinct text the policy sent to the embedder on that trace, once
  (a deployment embeds a stored result once; a changed query again), counted with B's tokenizer;
* ``ρ``: the cache fraction. C.2 prices every method with the fraction observed for Full history
  in the same setting (here: the prefix-cache reuse of Full history, :mod:`.cache`, over the
  cost-comparison traces of the same source); :func:`trace_cost` with a policy's own measured
  fraction gives the second variant (what a prefix cache would really serve that policy).

Normalisation (C.1 and eq. 9): the cost-comparison set is the traces whose Full history exceeds B
before some invocation; the normalised cost of policy ``m`` is the ratio of mean costs over that
set, ``mean_i C_{m,i} / mean_i C_{Full,i}`` (a ratio of means, not a mean of ratios), so Full
history = 1. Traces on which ``m`` could not render some invocation (budget errors) are left out of
both means for ``m``. Graph storage and local computation are outside this measure (C.2).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterable


@dataclass(frozen=True)
class Prices:
    """USD per million tokens; defaults are ContextRender eq. 3's reference prices."""

    input: float = 2.0
    cached_input: float = 0.5
    output: float = 8.0
    embedding: float = 0.13

    @classmethod
    def parse(cls, items: Iterable[str]) -> "Prices":
        """From ``KEY=VALUE`` strings (keys: input, cached_input, output, embedding).

        Raises:
            ValueError: an unknown key or a value that is not a number >= 0.
        """
        known = {f.name for f in fields(cls)}
        values: dict[str, float] = {}
        for item in items:
            key, sep, raw = item.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in known:
                raise ValueError(f"price {item!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(known))}")
            try:
                v = float(raw)
            except ValueError:
                v = -1.0
            if not v >= 0:
                raise ValueError(f"price {item!r}: the value must be a number >= 0 (USD per million tokens)")
            values[key] = v
        return cls(**values)


@dataclass
class Usage:
    """Token usage of one policy on one trace (C.2): ``P`` input, ``O`` output, ``E`` embedding
    tokens, and ``cached``: the part of ``P`` a prefix cache could serve (:mod:`.cache`)."""

    P: int = 0
    O: int = 0
    E: int = 0
    cached: int = 0

    @property
    def own_fraction(self) -> float:
        """The policy's own measured cache fraction ``cached / P`` (0 without input)."""
        return self.cached / self.P if self.P else 0.0

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(self.P + other.P, self.O + other.O, self.E + other.E, self.cached + other.cached)


def trace_cost(u: Usage, rho: float, prices: Prices = Prices()) -> float:
    """Eq. 3: the cost in USD of usage ``u`` with cache fraction ``rho`` (0 ≤ rho ≤ 1).

    Raises:
        ValueError: ``rho`` outside [0, 1].
    """
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"cache fraction rho must be in [0, 1], got {rho}")
    return ((prices.input * (1.0 - rho) + prices.cached_input * rho) * u.P
            + prices.output * u.O + prices.embedding * u.E) / 1e6


def full_fraction(full: Iterable[Usage]) -> float:
    """ρ of a setting: Full history's cached share of its input over the given traces (C.2)."""
    total = sum(full, Usage())
    return total.own_fraction


@dataclass(frozen=True)
class TraceCost:
    """One trace's inputs to the normalisation: the policy's usage, Full history's usage on the same
    trace, the setting's ρ, whether the trace is in the cost-comparison set, and whether the policy
    had budget errors there."""

    usage: Usage
    full: Usage
    rho: float
    compared: bool
    failed: bool = False


@dataclass(frozen=True)
class NormalisedCost:
    """``mean_cost`` in USD per trace (ρ of Full history), ``normalised`` (Full = 1), the same pair
    priced with the policy's own measured ρ, and the number of traces averaged."""

    mean_cost: float | None
    normalised: float | None
    mean_cost_own: float | None
    normalised_own: float | None
    traces: int


def normalise(items: Iterable[TraceCost], prices: Prices = Prices()) -> NormalisedCost:
    """Eq. 9 over the traces of one policy (module docstring)."""
    used = [t for t in items if t.compared and not t.failed]
    if not used:
        return NormalisedCost(None, None, None, None, 0)
    n = len(used)
    full = sum(trace_cost(t.full, t.rho, prices) for t in used) / n
    mean = sum(trace_cost(t.usage, t.rho, prices) for t in used) / n
    full_own = sum(trace_cost(t.full, t.full.own_fraction, prices) for t in used) / n
    own = sum(trace_cost(t.usage, t.usage.own_fraction, prices) for t in used) / n
    return NormalisedCost(mean, mean / full if full else None, own, own / full_own if full_own else None, n)
