"""Cache-stable rendering: between re-selections a rendering only appends, so that the previous
request is a byte-identical prefix of the next and a provider's prompt cache serves it; before a
re-selection it collects its young generation, rewriting only what followed the last collection.

Providers bill a repeated prompt prefix at a tenth to a quarter of the input price (OpenAI's
automatic prompt caching, Anthropic's ``cache_control`` breakpoints, DeepSeek's context caching;
``eval/prices.toml`` cites each rule). A policy that re-selects at every call rewrites the middle
of the prompt, so almost nothing after the system prompt is ever read from the cache: measured
with the evaluator's cache simulation (docs/evaluator.md, "Price models") on the 14 mini-swe-agent
trajectories at B = 6000, ``learned`` costs 0.73 of Full with OpenAI-style caching and 2.6 with
Anthropic-style caching, where every rewrite is a cache write at 1.25×.

:class:`CacheStable` wraps any registered policy (our decision: the three papers do not price a
cache):

* **Re-selection with hysteresis.** When the history no longer fits, the wrapped policy renders it
  at ``low_mark·B`` (default 0.75·B) instead of B; later calls append what arrived (complete, as
  stored) to that rendering until the history would pass B again, then it re-selects. With
  ``low_mark`` = 0.6 and results of ~500 tokens a call, a re-selection comes about every five
  calls instead of every call. ``low_mark`` trades recall (less history right after a
  re-selection) for cost: under a simple price model the cost per call, w·g/(1−L) + r·B·(1+L)/2
  (g tokens appended a call, w and r the cache write and read prices), rises with the mark L for
  every price, so the mark is chosen for recall; the default was chosen on the price models'
  measured cost and recall (docs/evaluator.md, "Cache-stable rendering: the low mark").
* **Only appends in between.** A call extends the previous rendering when everything that arrived
  since is a plain continuation: new messages in order, each tool result right after the call that
  asked for it (or answering the previous rendering's in-flight call), no system message, no second
  result for an old call. Anything else re-selects, and so does a pin or unpin since the previous
  call (docs/architecture.md, "Pins"). The newest results are therefore always
  complete (invariant §5.9), the in-flight call is last (§5.4), and a new user message makes the
  previous one ordinary history, charged to B.
* **A result needed between re-selections is shown again at the end** (``recall_tail``, on by
  default): when the latest assistant message used values of a result the rendering does not show
  complete (Tool-Flow Analysis' observed reuse, ContextRender §3.2 / A.2: each value is attributed
  to the first result that held it), a complete copy of that result, headed with its id
  (:data:`~historygraph.render.markers.RECALLED`), is appended after the new results as a user
  message, if the history stays within B. Appending keeps the prefix; the alternatives were
  measured with the evaluator (docs/evaluator.md, "Cache-stable rendering").
* **A result the wrapped policy now finds likely is shown again at the end** (``predicted_tail``,
  0.4 by default): when the wrapped policy gives reuse probabilities (``reuse_probabilities``:
  ``learned``), each result the rendering does not show complete whose probability for the next
  call is at least ``predicted_tail`` gets a complete copy appended the same way, most probable
  first, while the history stays within B. First chosen (0.1) on the 14 mini-swe-agent
  trajectories at B = 6000, where a copy is cheap (+2.0 recall points for +0.007 of Full
  history's OpenAI-style cost); on the real Claude Code sessions each copy is written at the
  1-hour cache's 2× and read at every later call, and at an equal bill fewer copies keep more:
  0.4 was chosen among 0.05, 0.1, 0.2, 0.4, 0.7 and 0 (off) on half of the 50 real sessions
  (recall at an equal bill, both agents weighted alike) and gives, on the other half, +5.5
  points on Claude Code and +1.2 on Codex against 0.1; on the research traces at the same B it
  keeps 0.2 points less (mini-swe-agent 0.6 at 6000), at an equal Anthropic-style bill 0.3 more
  (docs/evaluator.md, "Generations").
* **Generations: a minor collection before a re-selection** (``young``; our design, after a
  generational garbage collector): when what arrived would take the history past B, the rendering
  is split where the last collection or re-selection left it: the messages before that point (the
  old generation) stay byte for byte, and of those after it (the young generation) complete stored
  results become placeholders and copies at the tail go, least likely reused per token first by
  the wrapped policy's reuse probabilities (:data:`YOUNG_COST_EXPONENT`), until the history is within
  ``young·B``; then the copies above are appended as after an append, and the point moves to the
  latest assistant message. Only when that cannot reach ``young·B`` does the wrapped policy
  re-select (to ``low_mark·B``). The newest results (§5.9), pinned ones and results shorter than
  their placeholder are never collected.
  Only a wrapped policy with ``reuse_probabilities`` (``learned``) collects; the others re-select
  as before. Each request carries the points as ``Rendering.stats["cache_boundaries"]`` (the old generation's
  end, and at a collection the new one's), where the proxy (:mod:`historygraph.providers.anthropic_cache`)
  and the replay's Anthropic-style cache (:mod:`historygraph.eval.prompt_cache`) put a breakpoint,
  so a collection reads the old generation from the cache and rewrites only the young one.
  Measured on the real Claude Code and Codex sessions (docs/evaluator.md, "Generations"): at an
  equal bill, +6.0 / +8.8 recall points on Claude Code (the half of the sessions ``young`` = 0.85
  and the ranking were chosen on / the other half), +0.0 / +2.1 on Codex; on the research traces
  at B = 6000 and 3000 a point or two of recall for a lower Anthropic-style bill.
* **A re-selection when the cache has expired** (``expiry``; our decision): when more than the
  prompt cache's TTL passed between the last message of the previous request and the newest one
  (both with a timestamp: a session log's recorded times, the time the proxy received each
  message), the provider has dropped the cached prefix and writes the next request whole anyway,
  so the wrapped policy re-selects there (``stats["cache_stable"] = "expired"``) instead of
  appending to a rendering that would be written at the same price. The TTL is the one the
  requests ask for (:attr:`~historygraph.history.graph.ContextGraph.cache_ttl`: the proxy reads
  Anthropic's ``"ttl": "1h"``, the replay a session's recorded 1-hour writes), else ``expiry``
  seconds: 300, Anthropic's default TTL and the lower end of OpenAI's "5 to 10 minutes of
  inactivity". Measured on the 50 real sessions (docs/evaluator.md, "Generations"), with nothing
  fitted: Claude Code +0.1 / +0.4 / +0.2 recall points at 16k / 32k / 64k for 0.5 / 0.7 / 1.8 %
  less of what was paid; Codex +0.4 / +0.8 / +0.2 for 0.6 / 1.1 / 1.5 % less.
* **The young generation on the 5-minute cache** (``young_ttl``, 300 s; our decision): under a
  client's 1-hour cache (Claude Code's, each write at 2× input) a request marks what follows the
  old generation's end with Anthropic's 5-minute TTL (writes at 1.25×), which that part outlives
  only until its next collection; the old generation keeps the hour
  (``Rendering.stats["cache_young_ttl"]``, read by the proxy, :mod:`historygraph.providers.anthropic_cache`
  rule 5, and by the replay's cache simulation). On the 40 Claude Code sessions, with nothing fitted:
  the same recall for 2–3 % less of what was paid at every budget, +3.2 recall points at an equal
  bill (docs/evaluator.md, "The young generation on the 5-minute cache").
* **After a pause, the old generation on the hour** (``old_ttl``, 3600 s; our decision): a client
  on Anthropic's 5-minute cache (requests whose breakpoints name no longer TTL,
  ``graph.cache_ttl`` 300) loses the whole cached prefix at every pause longer than 5 minutes.
  Once the session has paused so (a user reading, a long tool run), each request marks the system
  prompt and the old generation with the 1-hour TTL (writes at 2× input against 1.25×), the young
  generation with 5 minutes (``Rendering.stats["cache_old_ttl"]``, read by the proxy,
  :mod:`historygraph.providers.anthropic_cache` rule 6, and by the replay's cache simulation),
  and a later pause up to an hour costs a rewrite of the young generation instead of an expiry.
  A session that never pauses (an autonomous agent) never pays the hour. On the 15 Claude Code
  sessions of the shared set on the 5-minute cache, with nothing fitted, 4–5 % less of what was
  paid at 16k–64k for the same recall (docs/evaluator.md, "After a pause, the old generation on
  the hour").
* **A re-selection that keeps its head** (``tenure``, 0.3; our decision): on the 1-hour cache
  (a client's ``"ttl": "1h"``, or ``old_ttl`` after a pause), where every rewritten token costs
  2× input, a re-selection rendered to the low mark marks a tenure point, the first step boundary
  where the rendering's leading messages hold 0.3 of its input tokens, with a breakpoint there;
  the next re-selection keeps those messages byte for byte, reads them from the cache, and
  splices in the wrapped policy's rendering of what follows them (rendered again, once, to a
  smaller budget when together they pass ``low_mark·B``; a whole re-selection when that fails, the
  latest plan lies in the head unshown, or the cache expired). The head stays until a whole
  re-selection marks a new one (:mod:`historygraph.policies.kept_head`). Consecutive whole
  re-selections share a median 10 % of their tokens as a leading prefix, because the wrapped
  policy's choice changes early in the history; the head makes that share certain. On the 40
  Claude Code sessions of the shared set: 2–4 % less of what was paid at 16k–64k for −0.8 to
  +0.2 recall points, +3.0 points at an equal bill (0.3 chosen among 0.15, 0.3 and 0.5 on half
  of the sessions, +3.3 there; +2.8 on the other half); Codex and the research traces, whose
  caches charge no write premium, unchanged (docs/evaluator.md, "A re-selection that keeps its
  head").
* **The agent's newest steps stay in view** (``recent``, 5; ``recent_share``, 0.075; our decision,
  docs/architecture.md invariant 10): the wrapped policy shows the steps of the 5 newest assistant
  messages, text and tool calls as stored (their results may be placeholders), at every
  re-selection (:meth:`~historygraph.policies.learned.policy.Learned.with_recent`), newest first
  while together they add at most 0.075 of the budget; appends and collections never remove a
  step, so every call shows them. The share was chosen on the research traces (the largest of
  0.05, 0.075, 0.1 and 1 with no source of 500 or more reuses losing more than a point at B = 3000
  or 6000: mini-swe-agent −0.7 / −0.8) and measured on the 50 real sessions, which it was not
  chosen on (docs/learned.md, "In the default").
* **Under B nothing changes**: a history that fits in B is rendered by the wrapped policy, which
  returns it unchanged (§5.5), and it is extended as long as it fits.

The state (the previous rendering, the graph length it rendered, the budget of the last
re-selection and the pins then) is kept per graph and per wrapper
(:meth:`~historygraph.history.graph.ContextGraph.memo`) and, for a session of a store, in the store
(:mod:`historygraph.policies.stable_state`), read back whenever another process sharing the store
rendered the session since: proxy instances (or ``serve --workers``) serving one session in turn
extend one rendering, as one instance does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, cast

from historygraph.history.graph import ContextGraph
from historygraph.policies import stable_state
from historygraph.policies.base import Policy, Signals
from historygraph.policies.registry import create, register
from historygraph.policies.kept_head import kept_head, tenure_point
from historygraph.policies.stable_extend import collect_young, extend, young_start
from historygraph.render import BudgetTooSmallError, Layout, Rendering

SOURCE = "historygraph: prompt-cache-stable rendering over any policy"
HOUR = 3600.0
"""Anthropic's 1-hour prompt-cache TTL in seconds: a kept head (``tenure``) is read at the next
re-selection, which may come long after it was written (module docstring)."""
SHORT_TTL = 300.0
"""Anthropic's default prompt-cache TTL in seconds (5 minutes; docs.anthropic.com/en/docs/build-with-claude/prompt-caching):
a pause longer than it is what turns on ``old_ttl`` (module docstring)."""

BUDGET_DRIFT = 0.1
"""A budget within this share of the one of the last re-selection keeps the rendering appending (the
proxy's calibration moves B by a few tokens at every call; before, each move re-selected: 17-23 of 24
calls rewritten through the proxy, issue 49); a larger change re-selects at the new B."""


@dataclass(frozen=True)
class CacheStableConfig:
    """``low_mark``: the share of B a re-selection renders to (0 < low_mark ≤ 1; 1 re-selects at every
    call that does not fit, as the wrapped policy alone does); ``recall_tail``: append a complete
    copy of a result the latest tool call used and the rendering does not show; ``predicted_tail``:
    append one of each result the wrapped policy gives at least this reuse probability (0 = off;
    only a policy with ``reuse_probabilities``, such as ``learned``; 0.4 chosen as ``young`` was,
    module docstring); ``young``: the share of B a
    minor collection of the young generation renders to before a re-selection is tried (0 = off:
    every call that does not fit re-selects; only a policy with ``reuse_probabilities``). 0.85 was chosen among 0.75, 0.85 and 0.9 on half of
    the 50 real Claude Code and Codex sessions of the shared set (recall at an equal bill, both
    agents weighted alike) and reported on the other half (module docstring; docs/evaluator.md,
    "Generations"). ``expiry``: the prompt cache's TTL in seconds assumed when the graph's
    ``cache_ttl`` is unknown; a pause longer than it re-selects (0 = never; module docstring).
    ``recent``: the wrapped policy shows the steps of this many newest assistant messages whole at
    every re-selection (so at every call: appends and collections never remove a step) while together they
    add at most ``recent_share`` of the budget it renders to (0 = as the wrapped policy does; only a
    policy with ``with_recent``, such as ``learned``; module docstring). ``young_ttl``: 300 (seconds, the
    5-minute TTL) marks the young generation for Anthropic's 5-minute cache under a client's 1-hour
    one; 0 leaves every breakpoint the client's TTL (module docstring). ``old_ttl``: 3600 (seconds,
    the 1-hour TTL) marks the system prompt and the old generation with the hour under a client's
    5-minute cache once the session has paused for longer than 5 minutes; 0: never (module docstring).
    ``tenure``: on the 1-hour cache, the share of a re-selection's input tokens its head holds, which
    the next re-selection keeps as it was (0 ≤ tenure < 1; 0: off; module docstring)."""

    low_mark: float = 0.75
    recall_tail: bool = True
    predicted_tail: float = 0.4
    young: float = 0.85
    expiry: float = 300.0
    recent: int = 5
    recent_share: float = 0.075
    young_ttl: float = 300.0
    old_ttl: float = 3600.0
    tenure: float = 0.3

    def __post_init__(self) -> None:
        if not 0.0 < self.low_mark <= 1.0:
            raise ValueError(f"cache-stable config: low_mark must be in (0, 1], got {self.low_mark}")
        if not 0.0 <= self.young <= 1.0:
            raise ValueError(f"cache-stable config: young must be in [0, 1], got {self.young}")
        if not self.expiry >= 0.0:
            raise ValueError(f"cache-stable config: expiry must be ≥ 0 seconds, got {self.expiry}")
        if not 0.0 <= self.predicted_tail <= 1.0:
            raise ValueError(f"cache-stable config: predicted_tail must be in [0, 1], got {self.predicted_tail}")
        if not (isinstance(self.recent, int) and self.recent >= 0):
            raise ValueError(f"cache-stable config: recent must be a whole number ≥ 0, got {self.recent}")
        if not 0.0 <= self.recent_share <= 1.0:
            raise ValueError(f"cache-stable config: recent_share must be in [0, 1], got {self.recent_share}")
        if self.young_ttl not in (0.0, 300.0):
            raise ValueError(f"cache-stable config: young_ttl must be 300 (Anthropic's 5-minute TTL) or 0 (the client's), "
                             f"got {self.young_ttl}")
        if not 0.0 <= self.tenure < 1.0:
            raise ValueError(f"cache-stable config: tenure must be in [0, 1), got {self.tenure}")
        if self.old_ttl not in (0.0, 3600.0):
            raise ValueError(f"cache-stable config: old_ttl must be 3600 (Anthropic's 1-hour TTL) or 0 (never), "
                             f"got {self.old_ttl}")


class CacheStable:
    """A policy that renders as ``base`` at re-selections and appends in between (module docstring)."""

    Config = CacheStableConfig
    base_name: ClassVar[str] = ""

    def __init__(self, name: str = "", config: CacheStableConfig | None = None, base: Policy | None = None) -> None:
        self.config = config or CacheStableConfig()
        self.base: Policy = base if base is not None else create(self.base_name)
        recent = getattr(self.base, "with_recent", None)  # the newest steps in view (invariant 10)
        if recent is not None and self.config.recent:
            self.base = recent(self.config.recent, self.config.recent_share)
        self.name = name or f"{self.base.name}-stable"
        self._key = object()  # this wrapper's state in each graph's memo
        hook = getattr(self.base, "prefetch", None)  # the proxy's hook after an answer (ContextRender's query texts)
        if hook is not None:
            self.prefetch = hook

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals, *, keep: bool = True) -> Rendering:
        """The rendering of ``graph`` under ``budget`` tokens (module docstring). ``keep=False``: an
        inspection (the session API's render, ``historygraph render``): what the next call would
        get with no new message, the state neither changed nor written, so the session's next model
        call extends the rendering its previous call was sent."""
        if budget is None:
            return self.base.render(graph, budget, signals)
        memo: dict[str, Any] = graph.memo(("cache-stable", self._key), dict)
        stable_state.load(graph, self.name, memo)  # another process sharing the store rendered it since
        state = memo if keep else dict(memo)
        prev, length = state.get("rendering"), state.get("length", 0)
        if state.get("pins") != graph.pins:  # pinned or unpinned since: the previous rendering may hide a pin
            prev = None
        at = state.get("budget")  # B of the last re-selection: a budget that moved by a few tokens (the proxy's
        if at is not None and abs(budget - at) > BUDGET_DRIFT * at:  # calibration) keeps appending while it fits
            prev = None
        cfg = self.config
        probe = getattr(self.base, "reuse_probabilities", None)
        rank = (lambda positions: probe(graph, positions, signals)) if probe is not None else None
        generations = cfg.young > 0 and rank is not None
        hour = generations and state.get("paused", False) and self.lengthens(graph)  # the old generation on the hour
        expired = prev is not None and self.expired(graph, length, hour)
        if self.pause(graph, length) > SHORT_TTL:
            state["paused"] = True
        if expired:  # the provider dropped the cached prefix: the next request is written whole anyway
            prev = None
        predict = rank if cfg.predicted_tail > 0 else None
        boundary = state.get("boundary", 0)
        r = extend(prev, length, graph, budget, signals.counter, self.name, cfg.recall_tail,
                   predict, cfg.predicted_tail) if prev is not None else None
        marks = [boundary]  # where this request carries a breakpoint at a generation's end (module docstring)
        if r is None and prev is not None and generations and rank is not None:
            r = collect_young(prev, length, graph, budget, signals.counter, self.name, boundary, cfg, rank)
            if r is not None:  # what was young is old now, fixed until a re-selection
                state["boundary"] = young_start(r, graph)
                marks.append(state["boundary"])
        tenure = generations and cfg.tenure > 0 and (hour or (graph.cache_ttl or 0) >= HOUR)
        if r is None:
            head = state.get("tenure", 0) if tenure and prev is not None else 0
            r = self.reselect(graph, budget, signals, prev if head else None, head)
            state["budget"], state["boundary"] = budget, young_start(r, graph)
            marks = [state["boundary"]]
            # the head the next re-selection keeps: the one kept now, else a new tenure point; a breakpoint
            # there writes it (and reads it, when kept)
            state["tenure"] = (r.stats.get("kept_head") or (tenure_point(r, graph, cfg.tenure, signals.counter)
                                                            if "rendered_to" in r.stats else 0)) if tenure else 0
            if 0 < state["tenure"] < state["boundary"]:
                r.stats["tenure"] = state["tenure"]
                marks.insert(0, state["tenure"])
            if expired:
                r.stats["cache_stable"] = "expired"
        if r is not prev and generations:
            r.stats["cache_boundaries"] = [b for b in marks if 0 < b < len(r.messages)]
            if cfg.young_ttl:
                r.stats["cache_young_ttl"] = cfg.young_ttl
            if state.get("paused") and self.lengthens(graph):
                r.stats["cache_old_ttl"] = cfg.old_ttl
        changed = r is not prev or state.get("pins") != graph.pins
        state["rendering"], state["length"], state["pins"] = r, len(graph), graph.pins
        if changed and keep:
            stable_state.save(graph, self.name, state)
        return r

    def expired(self, graph: ContextGraph, length: int, hour: bool = False) -> bool:
        """Whether the provider's prompt cache has dropped the previous request: more than the TTL
        (``old_ttl`` when the old generation is on the ``hour``, else ``graph.cache_ttl``, else
        ``expiry`` seconds; 0 = never) passed between the last message that request held and the
        newest one (:meth:`pause`). The previous request used its cached prefix last (each read
        renews an entry, as both providers document)."""
        ttl = self.config.old_ttl if hour else graph.cache_ttl or self.config.expiry
        return bool(ttl) and self.pause(graph, length) > ttl

    def lengthens(self, graph: ContextGraph) -> bool:
        """Whether this wrapper puts the old generation on the hour (``old_ttl``) for ``graph``'s
        requests: they ask for Anthropic's 5-minute cache (``graph.cache_ttl``), whose breakpoints
        may each name their TTL (module docstring)."""
        return bool(self.config.old_ttl) and graph.cache_ttl == SHORT_TTL

    @staticmethod
    def pause(graph: ContextGraph, length: int) -> float:
        """Seconds between the last message of the previous request (position ``length - 1``) and
        the newest one, both with a timestamp (a session log's recorded times, the time the proxy
        received each message); 0 when either has none."""
        if not 0 < length <= len(graph):
            return 0.0
        then, now = graph.messages[length - 1].timestamp, graph.messages[-1].timestamp
        return now - then if then is not None and now is not None else 0.0

    def reselect(self, graph: ContextGraph, budget: int, signals: Signals, prev: Rendering | None = None,
                 head: int = 0) -> Rendering:
        """The wrapped policy's rendering: at B when the history fits (it comes back unchanged),
        else at ``low_mark·B`` (at B when the protected history needs more than that, or when
        ``low_mark·B`` would cut a newest result to an excerpt that B shows complete). With ``prev``
        and ``head`` (its tenure point, :func:`~historygraph.policies.kept_head.tenure_point`): ``prev``'s first ``head`` messages
        kept byte for byte and the wrapped policy's rendering of what follows them after
        (:func:`~historygraph.policies.kept_head.kept_head`), when that is possible within ``low_mark·B``."""
        low = int(self.config.low_mark * budget)
        layout = Layout(graph, signals.counter, budget)
        fits = layout.fits_in_full  # then the wrapped policy returns it unchanged (§5.5)
        r = None
        if not fits and low < budget:
            whole = {p for p, m in layout.required.items() if m.rendered_as is None}  # complete at B (§5.9)
            if prev is not None and head:
                r = kept_head(prev, head, graph, low, signals, self.base, whole)
            if r is None:
                try:
                    r = self.base.render(graph, max(1, low), signals)
                except BudgetTooSmallError:
                    pass
                if r is not None and not whole <= set(r.full):
                    r = None
        if r is None:
            r = self.base.render(graph, budget, signals)
        else:
            r.stats["rendered_to"] = max(1, low)  # the low mark: room left for the calls that append
        r.policy, r.budget = self.name, budget
        r.stats["cache_stable"] = "reselected"
        return r


def inspect(policy: Policy, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
    """``policy``'s rendering of ``graph``, for a look at it rather than a model call: a cache-stable
    policy renders with ``keep=False`` (:meth:`CacheStable.render`), any other as it always does."""
    if isinstance(policy, CacheStable):
        return policy.render(graph, budget, signals, keep=False)
    return policy.render(graph, budget, signals)


def cache_stable(policy: Policy, params: dict[str, Any] | None = None) -> Policy:
    """``policy`` wrapped for cache-stable rendering (the proxy's and a stored session's default),
    with the wrapper's ``params`` (fields of :class:`CacheStableConfig`, e.g. ``serve -P
    learned-stable.young_ttl=0``); ``full`` (nothing to re-select) and a wrapper come back as they are.

    Raises:
        ValueError: a value :class:`CacheStableConfig` refuses; TypeError: an unknown field."""
    if isinstance(policy, CacheStable) or policy.name == "full":
        return policy
    config = CacheStableConfig(**params) if params else None
    return cast(Policy, CacheStable(f"{policy.name}-stable", config=config, base=policy))


def _variant(base: str) -> type[CacheStable]:
    return type(f"CacheStable_{base.replace('-', '_')}", (CacheStable,), {"base_name": base, "__doc__": CacheStable.__doc__})


for _base in ("learned", "contextrender", "prune"):
    register(f"{_base}-stable", SOURCE, f"{_base} at re-selections, only appending in between, so a provider's prompt "
             f"cache serves the previous request as a prefix (cost with the cache, docs/evaluator.md)")(_variant(_base))
