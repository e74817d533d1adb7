"""Replay recorded traces through policies (ContextRender B.4 "Measurement procedure").

For each trace the events are added to a fresh context graph one by one. Before every assistant
message ``j`` (one recorded model invocation) each policy renders the preceding history under the
budget; the rendering is checked against the invariants of docs/architecture.md, invariant §5, its tokens and render
time are recorded, and the B.4 reuse events of turn ``j`` are scored against the results it showed
in full. Turn ``j`` itself is added to the graph only afterwards, so every policy sees the same
history and is scored on the same event set.

Each rendering is also priced (:mod:`.cost`: input, output and embedding tokens, ContextRender
C.2), measured for prefix-cache reuse against the policy's previous rendering (:mod:`.cache`), sent
through each price model's simulated prompt cache (:mod:`.prompt_cache`, :mod:`.prices`) and
scored for value recall (:mod:`.recall`); Full history is rendered alongside as the cost
reference even when it is not among the policies. The form of every stored result at every
invocation (full, excerpt, placeholder, summary, dropped) is kept for the report's timeline.

:func:`replay_budgets` replays one trace at several budgets (ContextRender Figure 5) with fresh
policy instances per budget (policies may keep per-session state) and one Full-history reference.

The traces are also recorded in the store (one session per trace) and the store serves as the
embedding cache, so a second replay embeds nothing again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from historygraph.history.events import Trace
from historygraph.history.graph import ContextGraph
from historygraph.policies.base import Signals
from historygraph.policies.registry import create
from historygraph.render import BudgetTooSmallError, check_invariants
from historygraph.store import Store
from historygraph.signals.tokens import TokenCounter
from historygraph.eval.cache import PrefixReuse
from historygraph.eval.cost import Usage
from historygraph.eval.prices import PriceModel, default_price_models
from historygraph.eval.prompt_cache import ONE_HOUR, CacheTokens, PromptCache
from historygraph.eval.bill_bound import BoundInputs, bound_inputs
from historygraph.eval.recall import AGE_BINS, age_bin, rendered_tokens, reuse_events, value_hit
from historygraph.eval.recorded import (RECORDED, CacheCall, RecordedContext, fixed_tokens, has_recorded, home_price_model,
                                       project_of, recorded_call, recorded_tokens, uses_one_hour_cache)
from historygraph.eval.recent import RecentCounts
from historygraph.eval.steps_metrics import StepsCounts


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
    recent: RecentCounts = field(default_factory=RecentCounts)  # the newest assistant messages shown (eval.recent)
    extra: dict[str, list[float]] = field(default_factory=dict)  # numeric Rendering.stats, one entry per call
    model_calls: int = 0            # summariser/analyser calls made while rendering (ContextRender C.2)
    model_input_tokens: int = 0     # their input tokens, in the model's own tokenizer
    model_output_tokens: int = 0
    model_seconds: float = 0.0      # wall time spent waiting for them (included in render_seconds)
    value_hits: int = 0             # reuse events whose linking tokens were all visible (value recall)
    prompt_tokens: int = 0          # Σ complete model input of the agent invocations (P without model calls)
    output_tokens: int = 0          # Σ recorded assistant turns (O without model calls)
    embedding_tokens: int = 0       # distinct texts sent to the embedder, per trace (E)
    cached_tokens: int = 0          # Σ prompt tokens equal to a prefix of the previous prompt
    prompt_cache: dict[str, CacheTokens] = field(default_factory=dict)  # price model -> agent input through its cache

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
        self.recent.merge(other.recent)
        for k, v in other.extra.items():
            self.extra.setdefault(k, []).extend(v)
        self.model_calls += other.model_calls
        self.model_input_tokens += other.model_input_tokens
        self.model_output_tokens += other.model_output_tokens
        self.model_seconds += other.model_seconds
        self.value_hits += other.value_hits
        self.prompt_tokens += other.prompt_tokens
        self.output_tokens += other.output_tokens
        self.embedding_tokens += other.embedding_tokens
        self.cached_tokens += other.cached_tokens
        for model, tokens in other.prompt_cache.items():
            self.prompt_cache[model] = self.prompt_cache.get(model, CacheTokens()) + tokens

    @property
    def usage(self) -> Usage:
        """Token usage for eq. 3: agent prompts plus summariser/analyser calls (ContextRender C.2)."""
        return Usage(P=self.prompt_tokens + self.model_input_tokens, O=self.output_tokens + self.model_output_tokens,
                     E=self.embedding_tokens, cached=self.cached_tokens)

    def add_model_usage(self, stats: dict[str, Any]) -> None:
        """Add the ``model_*`` entries a policy reported in ``Rendering.stats`` (absent = 0)."""
        self.model_calls += int(stats.get("model_calls", 0))
        self.model_input_tokens += int(stats.get("model_input_tokens", 0))
        self.model_output_tokens += int(stats.get("model_output_tokens", 0))
        self.model_seconds += float(stats.get("model_seconds", 0.0))


@dataclass
class Timeline:
    """What each policy showed of each stored result at each invocation of one trace.

    ``results``: graph positions of the tool results; ``invocations``: positions of the assistant
    messages rendered for; ``forms[policy][k]``: one letter per result stored before invocation
    ``k`` (F full, E excerpt, P placeholder, S summary, D dropped/not shown, X budget error; F
    whenever the rendering shows the result complete, as recall scores it: in its place or as a
    copy appended at the end, :mod:`historygraph.policies.cache_stable`, whatever stands in its place);
    ``events``: ``(invocation index, result index)`` of each B.4 reuse event."""

    results: list[int] = field(default_factory=list)
    invocations: list[int] = field(default_factory=list)
    forms: dict[str, list[str]] = field(default_factory=dict)
    events: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class Reference:
    """Full history on one trace: its usage (the cost normaliser) and its largest history (tokens),
    which decides whether the trace is in the cost-comparison set at B (ContextRender C.1)."""

    usage: Usage
    max_history_tokens: int
    prompt_cache: dict[str, CacheTokens] = field(default_factory=dict)  # price model -> Full's input through its cache


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
    budget: int | None = None
    reference: Reference | None = None
    timeline: Timeline | None = None
    recorded: tuple[CacheTokens, int] | None = None  # the recorded calls' billed input and the output priced
    home_model: str | None = None  # the price model of the recorded model (eval.recorded.home_price_model)
    cache_calls: list[CacheCall] = field(default_factory=list)  # the cache check (eval.recorded.CacheCall)
    project: str = ""  # the project of a session log (eval.recorded.project_of), "" for a research trace
    bound: BoundInputs | None = None  # what the bill bound of this trace at this budget needs (eval.bill_bound)

    @property
    def compared(self) -> bool:
        """In the cost-comparison set: Full history exceeds B before some invocation (C.1)."""
        return self.reference is not None and self.budget is not None and self.reference.max_history_tokens > self.budget


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
    store.create_session(sid, {"source": trace.source, "path": str(Path(trace.path).resolve()), "trace_id": trace.trace_id,
                               **trace.meta})
    store.append(sid, trace.messages)
    return sid


def _form(m) -> str:  # noqa: ANN001
    return {None: "F", "excerpt": "E", "placeholder": "P", "summary": "S"}.get(m.rendered_as, "E")


def tool_schema_tokens(trace: Trace, counter: TokenCounter) -> int:
    """Tokens that lead every model input of ``trace`` besides its messages (C.2 counts the complete
    input): the tool schemas a trace recorded (``meta["tool_schemas"]``, as JSON); for a session
    log with recorded usage (Claude Code, Codex), the system prompt and tools estimated from its
    first call (:func:`.recorded.fixed_tokens`); else 0."""
    schemas = trace.meta.get("tool_schemas")
    if schemas:
        return counter.count(json.dumps(schemas, ensure_ascii=False))
    return fixed_tokens(trace, counter) if has_recorded(trace) else 0


def outside_budget(messages: Sequence, counter: TokenCounter) -> int:
    """Tokens of what B does not cover in ``messages`` (ContextRender A.4): the system messages and the
    current (latest) user message, so that the ``recorded`` row's history tokens are counted as a
    rendering's are."""
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    return sum(counter.count_message(m) for i, m in enumerate(messages) if m.role == "system" or (users and i == users[-1]))


def _score(st: PolicyStats, events: Sequence, visible: set[int], seen_tokens: set[str]) -> None:
    """Score the B.4 reuse events of one call against the results shown complete (``visible``)."""
    for e in events:
        hit = e.result in visible
        st.events += 1
        st.hits += hit
        st.value_hits += hit or value_hit(e, seen_tokens)
        cell = st.by_age[age_bin(e.age)]
        cell[0] += 1
        cell[1] += hit


def prompt_caches(models: dict[str, PriceModel] | None, counter: TokenCounter, fixed: int,
                  one_hour: bool = False) -> dict[str, PromptCache]:
    """One fresh simulated prompt cache per price model (default: the shipped ones); ``one_hour``:
    breakpoints written with the 1-hour TTL (a session whose agent did, :func:`.recorded.uses_one_hour_cache`)."""
    models = default_price_models() if models is None else models
    return {name: PromptCache(m, counter, fixed, one_hour) for name, m in models.items()}


def full_reference(trace: Trace, signals: Signals, price_models: dict[str, PriceModel] | None = None) -> Reference:
    """Full history's usage, largest history and input through each price model's cache on
    ``trace`` (the cost reference)."""
    full = create("full")
    fixed = tool_schema_tokens(trace, signals.counter)
    cache = PrefixReuse(signals.counter, fixed)
    clock = has_recorded(trace)  # session logs: the cache's clock is the calls' recorded times
    billed = prompt_caches(price_models, signals.counter, fixed, clock and uses_one_hour_cache(trace))
    graph = ContextGraph(session_id_for(trace))
    P = O = peak = 0
    for message in trace.messages:
        if message.role == "assistant" and len(graph):
            r = full.render(graph, None, signals)
            cache.observe(r.messages, r.input_tokens)
            for pc in billed.values():
                pc.observe(r.messages, r.input_tokens, message.timestamp if clock else None)
            P += r.input_tokens + fixed
            O += signals.counter.count_message(message)
            peak = max(peak, r.history_tokens)
        graph.append(message)
    return Reference(Usage(P=P, O=O, E=0, cached=cache.cached), peak, {k: pc.total for k, pc in billed.items()})


def replay_trace(trace: Trace, policies: dict[str, Any], budget: int, signals: Signals,
                 store: Store | None = None, reference: Reference | None = None,
                 price_models: dict[str, PriceModel] | None = None) -> TraceResult:
    """Replay one trace through ``policies`` (name -> policy instance) under ``budget`` tokens.
    ``reference``: Full history's figures on this trace when already computed (else computed here);
    ``price_models``: the prompt caches to simulate (default: the shipped price models). A trace
    with recorded usage (a Claude Code or Codex log) also gets the ``recorded`` row: what the agent
    itself sent at each call, after its own compactions (:mod:`.recorded`)."""
    # (over 80 lines: one walk over the trace with every policy's accumulators in locals; split, each piece would take them all as arguments)
    sid = record_trace(store, trace) if store is not None else session_id_for(trace)
    events_at: dict[int, list] = defaultdict(list)
    events = reuse_events(trace.messages)
    for e in events:
        events_at[e.turn].append(e)
    rec = RecordedContext(trace) if has_recorded(trace) else None
    home = home_price_model(trace) if rec is not None else None
    usage_at = {int(u["message"]): u for u in trace.meta.get("usage") or ()} if rec is not None else {}
    cache_calls: list[CacheCall] = []  # the recorded requests through the home model's simulated cache, against their bill
    rows = list(policies) + ([RECORDED] if rec is not None else [])
    stats = {name: PolicyStats() for name in rows}
    counter = signals.counter
    fixed = tool_schema_tokens(trace, counter)
    caches = {name: PrefixReuse(counter, fixed) for name in rows}
    clock = rec is not None  # session logs: the cache's clock is the calls' recorded times (eval.prompt_cache)
    one_hour = clock and uses_one_hour_cache(trace)
    billed = {name: prompt_caches(price_models, counter, fixed, one_hour) for name in rows}
    embedded: dict[str, set[str]] = {name: set() for name in policies}
    log = signals.embedding_log()
    timeline = Timeline(forms={name: [] for name in rows})
    graph = ContextGraph(sid)
    home_model = (price_models or default_price_models()).get(home or "")  # the recorded model's price model
    graph.cache_ttl = ONE_HOUR if one_hour else (  # what the agent's requests asked for (eval.recorded)
        home_model.ttl_seconds if clock and home_model is not None and home_model.caching == "breakpoints" else None)
    invocations = 0
    assistants: list[int] = []  # positions of the assistant messages in the graph (eval.recent)
    for j, message in enumerate(trace.messages):
        if message.role == "assistant" and len(graph):
            invocations += 1
            timeline.invocations.append(j)
            index = {p: k for k, p in enumerate(timeline.results)}
            for e in events_at.get(j, ()):
                timeline.events.append((invocations - 1, index[e.result]))
            out_tokens = counter.count_message(message)
            for name, policy in policies.items():
                st = stats[name]
                log.clear()
                if getattr(policy, "reads_future", False):  # clairvoyant bounds: the results reused at j
                    policy.upcoming = frozenset(e.result for e in events_at.get(j, ()))
                t0 = time.perf_counter()
                try:
                    r = policy.render(graph, budget, signals)
                except BudgetTooSmallError:
                    st.budget_errors += 1
                    visible: set[int] = set()
                    seen_tokens: set[str] = set()
                    caches[name].skip()
                    st.recent.observe(assistants, trace.messages, (), ())
                    for pc in billed[name].values():
                        pc.skip(message.timestamp if clock else None)
                    timeline.forms[name].append("X" * len(timeline.results))
                else:
                    st.render_seconds.append(time.perf_counter() - t0)
                    st.history_tokens.append(r.history_tokens)
                    st.input_tokens.append(r.input_tokens)
                    st.add_model_usage(r.stats)
                    st.prompt_tokens += r.input_tokens + fixed
                    st.output_tokens += out_tokens
                    st.cached_tokens += caches[name].observe(r.messages, r.input_tokens)
                    for pc in billed[name].values():
                        pc.observe(r.messages, r.input_tokens, message.timestamp if clock else None,
                                   r.stats.get("cache_boundaries", ()), r.stats.get("cache_young_ttl"),
                                   r.stats.get("cache_old_ttl"))
                    for text in log:
                        if text not in embedded[name]:
                            embedded[name].add(text)
                            st.embedding_tokens += counter.count(text)
                    try:
                        check_invariants(r, graph, counter)
                    except AssertionError as exc:
                        st.violations.append(f"{trace.trace_id}@{j}: {exc}")
                    visible = set(r.full)
                    st.recent.observe(assistants, trace.messages, r.messages, r.positions)
                    for k, v in r.stats.items():
                        if isinstance(v, (int, float)):
                            st.extra.setdefault(k, []).append(float(v))
                    forms = {p: _form(m) for m, p in zip(r.messages, r.positions) if p is not None}
                    # complete as scored: a copy at the tail (cache-stable rendering) has no position of its own
                    forms.update(dict.fromkeys(visible, "F"))
                    timeline.forms[name].append("".join(forms.get(p, "D") for p in timeline.results))
                    seen_tokens = rendered_tokens(r.messages) if events_at.get(j) else set()
                st.steps.observe(graph, visible, message)
                _score(st, events_at.get(j, ()), visible, seen_tokens)
            if rec is not None:  # what the agent itself sent (after its compactions)
                sent, span = rec.at(j)
                st = stats[RECORDED]
                tokens = counter.count_messages(sent)
                st.history_tokens.append(tokens - outside_budget(sent, counter))
                st.input_tokens.append(tokens)
                st.prompt_tokens += tokens + fixed
                st.output_tokens += out_tokens
                st.cached_tokens += caches[RECORDED].observe(sent, tokens)
                for model_name, pc in billed[RECORDED].items():
                    sim = pc.observe(sent, tokens, message.timestamp if clock else None)
                    if model_name == home and j in usage_at:
                        cache_calls.append(CacheCall(j, sim, recorded_call(usage_at[j])))
                visible = {p for p in span if trace.messages[p].role == "tool"}
                st.recent.observe(assistants, trace.messages, sent, [None] * (len(sent) - len(span)) + list(span))
                timeline.forms[RECORDED].append("".join("F" if p in visible else "D" for p in timeline.results))
                st.steps.observe(graph, visible, message)
                _score(st, events_at.get(j, ()), visible, rendered_tokens(sent) if events_at.get(j) else set())
        if message.role == "tool":
            timeline.results.append(len(graph))
        elif message.role == "assistant":
            assistants.append(len(graph))
        graph.append(message)
    log.clear()
    for name, st in stats.items():
        st.prompt_cache = {k: pc.total for k, pc in billed[name].items()}
    for st in stats.values():  # per-session peak of a policy's state size (ReCAP graph memory)
        if st.extra.get("graph_bytes"):
            st.extra["graph_bytes_session"] = [max(st.extra["graph_bytes"])]
    if reference is None:
        full = stats.get("full")
        reference = (Reference(full.usage, max(full.history_tokens, default=0), dict(full.prompt_cache))
                     if full is not None and not full.budget_errors
                     else full_reference(trace, signals, price_models))  # Full history among the policies: its figures are the reference
    return TraceResult(trace.source, trace.path, trace.trace_id, sid, len(trace.messages),
                       len(graph.results()), invocations, stats, budget, reference, timeline,
                       _recorded(trace, stats) if rec is not None else None, home, cache_calls, project_of(trace),
                       bound_inputs(trace.messages, events, counter, fixed, budget))


def _recorded(trace: Trace, stats: dict[str, PolicyStats]) -> tuple[CacheTokens, int]:
    """The recorded calls' billed input (:func:`.recorded.recorded_tokens`) with the output every row
    is priced with, the recorded assistant messages as counted: Claude Code logs keep a partial
    ``output_tokens`` (a value from the start of the stream in most calls), and output is the same
    for every row, so the bills differ by their input alone."""
    billed, _ = recorded_tokens(trace)
    return billed, stats[RECORDED].output_tokens


def replay_budgets(trace: Trace, policy_names: Sequence[str], budgets: Sequence[int], signals: Signals,
                   store: Store | None = None, params: dict[str, dict[str, Any]] | None = None,
                   price_models: dict[str, PriceModel] | None = None) -> list[TraceResult]:
    """Replay ``trace`` at every budget in ``budgets`` (one result each, in that order): the trace
    is parsed once, the embedding cache and one Full-history reference are shared, and each budget
    gets fresh policy instances (``params``: policy -> parameter overrides; ``price_models``: as
    :func:`replay_trace`)."""
    reference = full_reference(trace, signals, price_models)
    params = params or {}
    return [replay_trace(trace, {n: create(n, replay=True, **params.get(n, {})) for n in policy_names}, b, signals, store,
                         reference, price_models) for b in budgets]


def replay(traces: Iterable[Trace], policy_names: list[str], budget: int, signals: Signals,
           store: Store | None = None, on_trace: Callable[[TraceResult], None] | None = None,
           price_models: dict[str, PriceModel] | None = None) -> list[TraceResult]:
    """Replay every trace; ``on_trace`` is called after each (progress reporting)."""
    policies = {name: create(name, replay=True) for name in policy_names}
    out = []
    for trace in traces:
        res = replay_trace(trace, policies, budget, signals, store, price_models=price_models)
        out.append(res)
        if on_trace:
            on_trace(res)
    return out
