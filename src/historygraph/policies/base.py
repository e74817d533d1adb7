"""The policy interface: :class:`Policy`, the :class:`Signals` handed to every policy, and
:class:`PolicyError`.

A policy is a selection strategy behind one interface: ``render(graph, budget, signals)``
returns a :class:`~historygraph.render.Rendering` of the whole graph for the next invocation.
Policies never modify the graph. Each policy class declares a typed ``Config`` dataclass whose
defaults come from its paper; the registry (:mod:`historygraph.policies.registry`) builds one
from keyword overrides and rejects unknown fields by name.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Protocol

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
