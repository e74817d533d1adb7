"""Training examples for the learned selector, from recorded traces.

One example per (invocation ``t``, stored tool result ``r``) of a trace, replayed event by event as
the evaluator does: the features are those of :func:`historygraph.policies.learned.features.feature_matrix` on
the history before ``t``; ``reused`` is *observed reuse*, the production signal of Tool-Flow Analysis
(ContextRender, arXiv:2609.37743, §3.2, A.2): ``r`` is labelled reused at ``t`` when the assistant
message of ``t`` (its text or a tool call) repeats a TFA value that TFA attributes to ``r`` (first
earlier result holding it). This is what a deployment can log about its own sessions; the
evaluator's B.4 rule (another token pattern, first appearance anywhere in the transcript) is never
used, so Later-Used Result Recall measured afterwards tests the selector, not the metric.

``within`` labels reuse at any of the next ``horizon`` invocations (``t … t+horizon−1``).
``valued`` is ``reused`` restricted to values that are no file name (:func:`historygraph.signals.steps.features.files_in`
finds none in them): an agent repeats ``compiler.py`` in every ``sed -n`` of that file, which says
little about which of the results showing it it needs.

``fresh`` is ``valued`` or ``named`` counting only the values and identifiers that no user or
assistant message before ``r`` contains: ``r`` was their first source. A name the agent wrote
itself before any result showed it (the script it created, a path it chose, a function it asked
``grep`` for) is attributed by TFA to the first result that happens to hold it, yet the agent did not
learn it there. Computed from the recorded messages alone (what a deployment logs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from historygraph.history.events import Trace
from historygraph.history.graph import ContextGraph, operations
from historygraph.signals.steps.features import files_in
from historygraph.signals.tokens import TokenCounter
from historygraph.policies.learned.facts_cache import graph_facts
from historygraph.policies.learned.features import FEATURES, feature_matrix


@dataclass
class Examples:
    """Rows of one or more traces.

    Attributes:
        X: features, shape ``(n, len(FEATURES))``.
        reused: 1 when the result is reused at the invocation itself, shape ``(n,)``.
        within: 1 when it is reused at one of the next ``horizon`` invocations, shape ``(n,)``.
        named: 1 when the invocation's message names a code identifier that no earlier result held
            (ContextWeaver §3.1's identifier rule, attributed to the first result holding it as TFA
            attributes values), shape ``(n,)``: a second observed-reuse signal; the shipped recipe
            labels a result reused when ``reused`` or ``named`` (:mod:`historygraph.policies.learned.train`).
        group: index of the trace each row comes from (for grouped cross-validation), shape ``(n,)``.
        invocation: running invocation number within its trace, shape ``(n,)``.
        valued: 1 when the invocation's message repeats a TFA value attributed to the result that is
            not a file name (module docstring), shape ``(n,)``; ``valued ≤ reused``.
        fresh: ``valued`` or ``named`` by values / identifiers that no user or assistant message
            before the result contains (module docstring), shape ``(n,)``; ``fresh ≤ max(valued, named)``.
    """

    X: np.ndarray
    reused: np.ndarray
    within: np.ndarray
    group: np.ndarray
    invocation: np.ndarray
    named: np.ndarray
    valued: np.ndarray
    fresh: np.ndarray

    @staticmethod
    def concat(parts: list["Examples"]) -> "Examples":
        if not parts:
            z = np.zeros(0)
            return Examples(np.zeros((0, len(FEATURES))), z, z, z.astype(int), z.astype(int), z, z, z)
        return Examples(*(np.concatenate([getattr(p, k) for p in parts])
                          for k in ("X", "reused", "within", "group", "invocation", "named", "valued", "fresh")))


_NEVER = 1 << 62  # the position of a string no such message contains


class _Written:
    """The position of the first user or assistant message (text and tool calls) of ``trace``
    containing a string, per string asked for (a substring search over those messages, memoised)."""

    def __init__(self, trace: Trace) -> None:
        self.texts = [(j, m.content if m.role == "user" else "\n".join(operations(m)))
                      for j, m in enumerate(trace.messages) if m.role in ("user", "assistant")]
        self.first: dict[str, int] = {}

    def __call__(self, token: str) -> int:
        at = self.first.get(token)
        if at is None:
            at = self.first[token] = next((j for j, text in self.texts if token in text), _NEVER)
        return at


def trace_examples(trace: Trace, counter: TokenCounter, group: int = 0, horizon: int = 3) -> Examples:
    """Replay ``trace`` and return its examples (see module docstring)."""
    graph = ContextGraph(trace.trace_id)
    rows: list[np.ndarray] = []
    cand: list[list[int]] = []
    reuse_turn: dict[int, list[int]] = {}  # result position -> invocation numbers that reused it
    named_at: set[tuple[int, int]] = set()  # (invocation, result) where the message named an identifier of it
    valued_at: set[tuple[int, int]] = set()  # (invocation, result) reused by a value that is no file name
    fresh_at: set[tuple[int, int]] = set()  # (invocation, result) reused by a value or identifier r was the first source of
    written = _Written(trace)
    inv = 0
    for j, message in enumerate(trace.messages):
        if message.role == "assistant" and len(graph):
            results = graph.results()
            if results:
                rows.append(feature_matrix(graph, results, counter))
                cand.append(results)
            else:
                rows.append(np.zeros((0, len(FEATURES))))
                cand.append([])
            graph.append(message)
            facts = graph_facts(graph, counter)
            named_here: dict[int, list[str]] = {}  # result -> identifiers of this message it held first
            for ident in facts.assistant_idents[-1][1]:
                first = facts.ident_first.get(ident)
                if first is not None:
                    named_here.setdefault(first, []).append(ident)
            for p in results:
                ms = graph.reuse.matches.get(p, ())
                if ms and ms[-1].user == j:
                    reuse_turn.setdefault(p, []).append(inv)
                    k = len(ms)
                    while k and ms[k - 1].user == j:  # this message's matches come last
                        k -= 1
                        if not files_in(ms[k].value):
                            valued_at.add((inv, p))
                            if written(ms[k].value) > p:
                                fresh_at.add((inv, p))
                turns = facts.ident_turns.get(p)
                if turns and turns[-1] == graph.turn_of[j]:
                    named_at.add((inv, p))
                    if any(written(ident) > p for ident in named_here.get(p, ())):
                        fresh_at.add((inv, p))
            inv += 1
        else:
            graph.append(message)
    X, reused, within, invocation, named, valued, fresh = [], [], [], [], [], [], []
    for i, (x, results) in enumerate(zip(rows, cand)):
        X.append(x)
        for p in results:
            reused_by = reuse_turn.get(p, ())  # the invocations that reused result p
            reused.append(float(i in reused_by))
            within.append(float(any(i <= k < i + horizon for k in reused_by)))
            invocation.append(i)
            named.append(float((i, p) in named_at))
            valued.append(float((i, p) in valued_at))
            fresh.append(float((i, p) in fresh_at))
    n = len(reused)
    return Examples(np.concatenate(X) if X else np.zeros((0, len(FEATURES))), np.array(reused), np.array(within),
                    np.full(n, group), np.array(invocation, dtype=int), np.array(named), np.array(valued),
                    np.array(fresh))
