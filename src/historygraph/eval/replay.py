"""Replay recorded traces through policies (ContextRender B.4 "Measurement procedure").

For each trace the events are added to a fresh context graph one by one. Before every assistant
message ``j`` (one recorded model invocation) each policy renders the preceding history under the
budget; the rendering is checked against the invariants of DESIGN.md §5, its tokens and render
time are recorded, and the B.4 reuse events of turn ``j`` are scored against the results it showed
in full. Turn ``j`` itself is added to the graph only afterwards, so every policy sees the same
history and is scored on the same event set.

The traces are also recorded in the store (one session per trace) and the store serves as the
embedding cache, so a second replay embeds nothing again.
"""

from __future__ import annotations

import time
from pathlib import Path
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ..events import Trace
from ..graph import ContextGraph
from ..policies.base import Signals, create
from ..render import BudgetTooSmallError, check_invariants
from ..store import Store
from .recall import AGE_BINS, age_bin, reuse_events
from .steps_metrics import StepsCounts


@dataclass
class PolicyStats:
    """Figures of one policy on one trace (or summed over many)."""

    events: int = 0
    hits: int = 0
    by_age: dict[str, list[int]] = field(default_factory=lambda: {b: [0, 0] for b in AGE_BINS})  # bin -> [events, hits]
    history_tokens: list[int] = field(default_factory=list)
    input_tokens: list[int] = field(default_factory=list)
    render_seconds: list[float] = field(default_factory=list)
    budget_errors: int = 0
    violations: list[str] = field(default_factory=list)
    steps: StepsCounts = field(default_factory=StepsCounts)  # repeated reads, old full observations
    extra: dict[str, list[float]] = field(default_factory=dict)  # numeric Rendering.stats, one entry per call
    model_calls: int = 0            # summariser/analyser calls made while rendering (ContextRender C.2)
    model_input_tokens: int = 0     # their input tokens, in the model's own tokenizer
    model_output_tokens: int = 0
    model_seconds: float = 0.0      # wall time spent waiting for them (included in render_seconds)

    def merge(self, other: "PolicyStats") -> None:
        self.events += other.events
        self.hits += other.hits
        for b in AGE_BINS:
            self.by_age[b][0] += other.by_age[b][0]
            self.by_age[b][1] += other.by_age[b][1]
        self.history_tokens += other.history_tokens
        self.input_tokens += other.input_tokens
        self.render_seconds += other.render_seconds
        self.budget_errors += other.budget_errors
        self.violations += other.violations
        self.steps.merge(other.steps)
        for k, v in other.extra.items():
            self.extra.setdefault(k, []).extend(v)
        self.model_calls += other.model_calls
        self.model_input_tokens += other.model_input_tokens
        self.model_output_tokens += other.model_output_tokens
        self.model_seconds += other.model_seconds

    def add_model_usage(self, stats: dict[str, Any]) -> None:
        """Add the ``model_*`` entries a policy reported in ``Rendering.stats`` (absent = 0)."""
        self.model_calls += int(stats.get("model_calls", 0))
        self.model_input_tokens += int(stats.get("model_input_tokens", 0))
        self.model_output_tokens += int(stats.get("model_output_tokens", 0))
        self.model_seconds += float(stats.get("model_seconds", 0.0))


@dataclass
class TraceResult:
    source: str
    path: str
    trace_id: str
    session_id: str
    messages: int
    results: int
    invocations: int
    stats: dict[str, PolicyStats]


def session_id_for(trace: Trace) -> str:
    """``format:file-name:trace-id`` (no slashes, so it is usable in URLs of the session API; the
    same file replayed by another path maps to the same session)."""
    return f"{trace.source}:{Path(trace.path).name}:{trace.trace_id}"


def record_trace(store: Store, trace: Trace) -> str:
    """Store ``trace`` as a session; reuse an identical stored one, never overwrite a different one."""
    base = sid = session_id_for(trace)
    k = 1
    while store.has_session(sid):
        if store.messages(sid) == trace.messages:
            return sid
        k += 1
        sid = f"{base}#{k}"
    store.create_session(sid, {"source": trace.source, "path": trace.path, "trace_id": trace.trace_id, **trace.meta})
    store.append(sid, trace.messages)
    return sid


def replay_trace(trace: Trace, policies: dict[str, Any], budget: int, signals: Signals,
                 store: Store | None = None) -> TraceResult:
    """Replay one trace through ``policies`` (name -> policy instance) under ``budget`` tokens."""
    sid = record_trace(store, trace) if store is not None else session_id_for(trace)
    events_at: dict[int, list] = defaultdict(list)
    for e in reuse_events(trace.messages):
        events_at[e.turn].append(e)
    stats = {name: PolicyStats() for name in policies}
    graph = ContextGraph(sid)
    invocations = 0
    for j, message in enumerate(trace.messages):
        if message.role == "assistant" and len(graph):
            invocations += 1
            for name, policy in policies.items():
                st = stats[name]
                t0 = time.perf_counter()
                try:
                    r = policy.render(graph, budget, signals)
                except BudgetTooSmallError:
                    st.budget_errors += 1
                    visible: set[int] = set()
                else:
                    st.render_seconds.append(time.perf_counter() - t0)
                    st.history_tokens.append(r.history_tokens)
                    st.input_tokens.append(r.input_tokens)
                    st.add_model_usage(r.stats)
                    try:
                        check_invariants(r, graph, signals.counter)
                    except AssertionError as exc:
                        st.violations.append(f"{trace.trace_id}@{j}: {exc}")
                    visible = set(r.full)
                    for k, v in r.stats.items():
                        if isinstance(v, (int, float)):
                            st.extra.setdefault(k, []).append(float(v))
                st.steps.observe(graph, visible, message)
                for e in events_at.get(j, ()):
                    hit = e.result in visible
                    st.events += 1
                    st.hits += hit
                    cell = st.by_age[age_bin(e.age)]
                    cell[0] += 1
                    cell[1] += hit
        graph.append(message)
    for st in stats.values():  # per-session peak of a policy's state size (ReCAP graph memory)
        if st.extra.get("graph_bytes"):
            st.extra["graph_bytes_session"] = [max(st.extra["graph_bytes"])]
    return TraceResult(trace.source, trace.path, trace.trace_id, sid, len(trace.messages),
                       len(graph.results()), invocations, stats)


def replay(traces: Iterable[Trace], policy_names: list[str], budget: int, signals: Signals,
           store: Store | None = None, on_trace: Callable[[TraceResult], None] | None = None) -> list[TraceResult]:
    """Replay every trace; ``on_trace`` is called after each (progress reporting)."""
    policies = {name: create(name) for name in policy_names}
    out = []
    for trace in traces:
        res = replay_trace(trace, policies, budget, signals, store)
        out.append(res)
        if on_trace:
            on_trace(res)
    return out
