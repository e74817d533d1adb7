"""The policy interface and the single registry of policy names.

A policy is a selection strategy behind one interface: ``render(graph, budget, signals)``
returns a :class:`~historygraph.render.Rendering` of the whole graph for the next invocation.
Policies never modify the graph. Each policy class declares a typed ``Config`` dataclass whose
defaults come from its paper; :func:`create` builds one from keyword overrides and rejects
unknown fields by name.
"""

from __future__ import annotations

import dataclasses
import difflib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Protocol, cast

from historygraph.history.graph import ContextGraph
from historygraph.models.chat import ChatModel, default_model
from historygraph.render import Rendering
from historygraph.signals.embeddings import CachedEmbedder, Embedder, default_embedder
from historygraph.signals.perplexity import TokenScorer, default_scorer
from historygraph.signals.tokens import TokenCounter


class PolicyError(ValueError):
    """Unknown policy name or bad configuration (the message names the field)."""


_CREATE = threading.RLock()  # Signals' first-use creation of its models (reentrant: a factory may read another signal)


@dataclass
class Signals:
    """Shared signal providers handed to every policy.

    Attributes:
        counter: the token counter that defines B's unit.
        embedder_factory: builds the sentence embedder on first use
            (:func:`historygraph.signals.embeddings.default_embedder`).
        model_factory: builds the chat model (summaries, analyses) on first use
            (:func:`historygraph.models.chat.default_model`: a configured endpoint, else local SmolLM2).
        scorer_factory: builds the token-surprisal model of the prompt compressors on first use
            (:func:`historygraph.signals.perplexity.default_scorer`: local SmolLM2-135M).
        store: the store whose caches (embeddings, summaries) are used; ``None`` = in-process only.

    Models are created on first use, so policies that do not need them never load one, and once
    (:data:`_CREATE`: threads that first ask at the same time, as the proxy's worker threads do
    when a burst of requests arrives, wait for the one that builds it instead of loading a copy each).
    """

    counter: TokenCounter = field(default_factory=TokenCounter)
    embedder_factory: Callable[[], Embedder] = default_embedder
    model_factory: Callable[[], ChatModel] = default_model
    scorer_factory: Callable[[], TokenScorer] = default_scorer
    store: Any = None
    _embedder: CachedEmbedder | None = None
    _model: ChatModel | None = None
    _scorer: TokenScorer | None = None
    _embed_log: list[str] | None = None

    @property
    def embedder(self) -> CachedEmbedder:
        if self._embedder is None:
            with _CREATE:
                if self._embedder is None:
                    embedder = CachedEmbedder(self.embedder_factory(), self.store)
                    embedder.log = self._embed_log
                    self._embedder = embedder
        return self._embedder

    def embedding_log(self) -> list[str]:
        """A list that receives every text a policy asks the embedder for from now on (cached or
        not; the evaluator clears it between renderings), without creating the embedder."""
        if self._embed_log is None:
            self._embed_log = []
            if self._embedder is not None:
                self._embedder.log = self._embed_log
        return self._embed_log

    @property
    def model(self) -> ChatModel:
        if self._model is None:
            with _CREATE:
                if self._model is None:
                    self._model = self.model_factory()
        return self._model

    @property
    def scorer(self) -> TokenScorer:
        if self._scorer is None:
            with _CREATE:
                if self._scorer is None:
                    self._scorer = self.scorer_factory()
        return self._scorer


class Policy(Protocol):
    name: ClassVar[str]

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering: ...


@dataclass(frozen=True)
class PolicySpec:
    name: str
    cls: type
    source: str
    summary: str
    defaults: dict[str, Any]
    replay_only: bool = False  # reads the recorded future (clairvoyant bounds): the evaluator only


REGISTRY: dict[str, PolicySpec] = {}
# The policy the library, the proxy and `historygraph render` use when none is named: `learned`, the
# highest Later-Used Result Recall (ContextRender B.4) on every source of the shared real traces at
# B = 6000 and 3000 with no more history tokens than ContextRender, and no embedding model to load
# (docs/learned.md). Name "contextrender" for the published ContextRender.
DEFAULT_POLICY = "learned"


def register(name: str, source: str, summary: str, replay_only: bool = False, **defaults: Any) -> Callable[[type], type]:
    """Class decorator: register ``cls`` under ``name``; ``defaults`` override its Config defaults
    (used for named variants such as the B.3 ablations). ``replay_only`` marks a policy that reads
    the recorded future (a clairvoyant bound): :func:`create` builds it only for the evaluator."""

    def deco(cls: type) -> type:
        if name in REGISTRY:
            raise PolicyError(f"policy name {name!r} registered twice")
        REGISTRY[name] = PolicySpec(name, cls, source, summary, defaults, replay_only)
        return cls

    return deco


def names(replay: bool = False) -> list[str]:
    """Registered policy names, sorted; the replay-only ones (clairvoyant bounds) only with ``replay``."""
    return sorted(n for n, spec in REGISTRY.items() if replay or not spec.replay_only)


def config_fields(name: str) -> dict[str, Any]:
    """The effective configuration of a registered policy: field -> default value."""
    spec = get_spec(name)
    cfg = getattr(spec.cls, "Config", None)
    out = {f.name: f.default for f in dataclasses.fields(cfg)} if cfg else {}
    out.update(spec.defaults)
    return out


def get_spec(name: str, replay: bool = True) -> PolicySpec:
    """The registered spec of ``name``. Raises ``PolicyError`` for an unknown name, naming the
    closest known ones (``difflib``'s ratio ≥ 0.6, as the CLI does) and listing all of them (without
    the replay-only ones unless ``replay``)."""
    try:
        return REGISTRY[name]
    except KeyError:
        known = names(replay)
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise PolicyError(f"unknown policy {name!r}; {hint}known: {', '.join(known)}") from None


def check_production(name: str) -> PolicySpec:
    """The spec of ``name`` if the library and the proxy may run it.

    Raises:
        PolicyError: unknown policy, or a replay-only policy (it reads the recorded future).
    """
    spec = get_spec(name, replay=False)
    if spec.replay_only:
        raise PolicyError(f"policy {name!r} reads the recorded future (a clairvoyant bound for the evaluator): "
                          f"it can only run in `historygraph replay`; choose a production policy such as 'learned' "
                          f"or 'contextrender'")
    return spec


def create(name: str, *, replay: bool = False, **overrides: Any) -> Policy:
    """Instantiate the policy ``name`` with its defaults plus ``overrides``. ``replay=True`` is
    passed only by the evaluator, which can show a policy the recorded future.

    Raises:
        PolicyError: unknown policy, unknown config field, a value of the wrong type (names the
            field and the expected type), a value the policy's ``Config`` refuses (its message), or
            a replay-only policy (``oracle``, ``oracle-omit``) asked for outside replay.
    """
    from historygraph.policies.params import check

    spec = check_production(name) if not replay else get_spec(name)
    cfg_cls = getattr(spec.cls, "Config", None)
    if cfg_cls is None:
        if overrides:
            raise PolicyError(f"policy {name!r} takes no parameters, got {', '.join(overrides)}")
        return cast(Policy, spec.cls(name=name))
    known = {f.name for f in dataclasses.fields(cfg_cls)}
    unknown = set(overrides) - known
    if unknown:
        raise PolicyError(f"policy {name!r} has no parameter(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    params = {**spec.defaults, **check(name, overrides)}
    try:
        config = cfg_cls(**params)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"policy {name!r}: {exc}") from None
    return cast(Policy, spec.cls(name=name, config=config))


ENTRY_POINT_GROUP = "historygraph.policies"


def load_plugins(group: str = ENTRY_POINT_GROUP) -> list[str]:
    """Register the policies that installed packages declare under the entry point ``group``.

    An entry point names a module or a class (``name = "package.module:Class"``). Loading it runs
    its :func:`register` decorators; a loaded class that registered nothing is registered under
    the entry point's name (``source``/``summary`` from its ``source`` attribute and docstring).
    A plugin that fails to load, or reuses a registered name, is skipped with a warning naming it:
    one broken package never stops the others. Returns the names added.
    """
    import warnings
    from importlib.metadata import entry_points

    added: list[str] = []
    for ep in entry_points(group=group):
        before = set(REGISTRY)
        try:
            obj = ep.load()
            if isinstance(obj, type) and ep.name not in REGISTRY and set(REGISTRY) == before:
                doc = (obj.__doc__ or "").strip().splitlines()
                register(ep.name, str(getattr(obj, "source", f"plugin {ep.value}")), doc[0] if doc else "")(obj)
        except Exception as exc:  # any failure of a third-party package is reported, not raised
            for n in set(REGISTRY) - before:
                del REGISTRY[n]
            warnings.warn(f"historygraph policy plugin {ep.name!r} ({ep.value}) not loaded: {type(exc).__name__}: {exc}",
                          RuntimeWarning, stacklevel=2)
            continue
        added += sorted(set(REGISTRY) - before)
    return added
