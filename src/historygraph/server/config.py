"""The proxy's settings: :class:`ServerConfig` and :data:`DEFAULTS`, the one table of
``historygraph serve``'s defaults (its options and :class:`ServerConfig` both read them from here).

A light module: importing it pulls neither FastAPI nor aiohttp, so the command line can read the
defaults, and a caller can build a config, without the ``server`` extra.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from historygraph.policies import DEFAULT_POLICY, check_production, create
from historygraph.render.recall import MAX_TOKENS as RECALL_MAX_TOKENS
from historygraph.signals.embeddings import EMBEDDERS, SERVE_EMBEDDER
from historygraph.signals.tokens import DEFAULT_ENCODING


@dataclass(frozen=True)
class ServeDefaults:
    """The defaults of ``historygraph serve`` (each option's meaning: :class:`ServerConfig` and
    ``historygraph serve --help``); the process options (host, port, logs, workers) are the
    command's alone."""

    upstream: str = "https://api.openai.com/v1"
    anthropic_upstream: str = "https://api.anthropic.com"
    gemini_upstream: str = "https://generativelanguage.googleapis.com"
    host: str = "127.0.0.1"
    port: int = 8642
    policy: str = DEFAULT_POLICY
    budget: int = 6000
    max_body_bytes: int = 20_000_000
    timeout: float = 600.0
    encoding: str = DEFAULT_ENCODING
    log_format: str = "json"
    log_level: str = "INFO"
    recall: bool = False
    recall_rounds: int = 3
    recall_max_tokens: int = RECALL_MAX_TOKENS
    calibrate: bool = True
    cache_stable: bool = True
    cache_breakpoints: bool = True
    workers: int = 1
    session_cache: int = 256
    embedder: str = SERVE_EMBEDDER


DEFAULTS = ServeDefaults()
"""The one table of serve defaults."""

def masked_url(url: str) -> str:
    """``url`` as the proxy shows it to clients and in its logs: credentials in it
    (``https://user:password@host/v1``, and the Gemini API's ``key`` query parameter) replaced by
    ``***`` (``https://***@host/v1``, ``?alt=sse&key=***``); the proxy still sends them upstream."""
    parts = urlsplit(url)
    if "@" in parts.netloc:
        parts = parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2])
    if parts.query:
        parts = parts._replace(query=re.sub(r"(^|&)key=[^&]*", r"\1key=***", parts.query))
    return urlunsplit(parts)


CONFIG_ENV = "HISTORYGRAPH_SERVE_CONFIG"  # JSON of a ServerConfig, read by each worker process
LOG_ENV = "HISTORYGRAPH_SERVE_LOG"  # JSON {"level", "json"} of historygraph serve's log options, for each worker


@dataclass
class ServerConfig:
    """Settings of one proxy instance.

    Attributes:
        upstream: OpenAI-compatible base URL including ``/v1`` (``/chat/completions`` and
            ``/models`` are appended).
        anthropic_upstream: Anthropic base URL (``/v1/messages`` is appended).
        gemini_upstream: Gemini API base URL (``/v1beta/models/{model}:{method}`` is appended;
            Google's Gemini API reference).
        store: store URL for :func:`historygraph.store.open_store` (SQLite path, ``:memory:``,
            ``postgresql://…``); ``None`` = the default SQLite file.
        policy, budget: defaults when a request sends no header; budget in tokens.
        auth_token: bearer token required by the session API; ``None`` = no auth.
        max_body_bytes: larger request bodies get 413.
        encoding: tokenizer defining the budget's unit.
        timeout: seconds to wait for the upstream (connect and between bytes).
        policy_params: parameter overrides per policy name (checked against each policy's Config).
        recall, recall_rounds, recall_max_tokens: the recall tool (:mod:`historygraph.server.recall_tool`):
            offered by default, answered calls per request at most, tokens per recalled result at most.
        calibrate: render proxied requests at the calibrated budget ``floor(B / max(1, ratio))``,
            ratio = median provider-reported / estimated prompt tokens (``--no-calibration``: B as given).
        cache_stable: wrap every policy but ``full`` for cache-stable rendering
            (:mod:`historygraph.policies.cache_stable`: between re-selections a session's rendering only
            appends, so the provider's prompt cache serves the previous request); on by default,
            ``--no-cache-stable`` re-selects at every request (docs/proxy.md, "Cache-stable rendering").
        cache_breakpoints: add the proxy's Anthropic prompt-cache breakpoints (``cache_control``
            after the tools and system prompt, on the opening, at each generation's end and on the last message, the client's own kept,
            at most 4 in all: :mod:`historygraph.providers.anthropic_cache`) to every rendered
            ``/v1/messages`` request; on by default: without a breakpoint Anthropic caches nothing,
            and with them a 25-call agent run's uncached input falls to a fraction (docs/proxy.md,
            "Prompt caches").
        session_cache: open sessions kept warm per process, least recently used dropped first:
            their graphs (:attr:`Store.graph_cache`, with the policies' per-graph state), the
            client messages last stored and the Anthropic wire turns last converted, so that a
            re-sent history is recognised without parsing it (:mod:`historygraph.history.sessions`,
            "Incremental comparison", :class:`~historygraph.server.convert.TurnCache`); 0 remembers no messages or turns
            (every request is parsed and compared in full) and keeps one graph.
        embed_threads: intra-op threads of this process's sentence embedder; ``None`` = all cores
            (``historygraph serve --workers N`` gives each worker cores // N, so that the workers'
            embedders do not compete for the same cores).
        embedder: the sentence embedder of the policies that embed, a name in
            :data:`~historygraph.signals.embeddings.EMBEDDERS`: ``wordllama`` by default
            (:data:`~historygraph.signals.embeddings.SERVE_EMBEDDER`: recall within 1 point of
            ``minilm``, the replays' default, at about 1/40 of its CPU per text; docs/proxy.md).
    """

    upstream: str = DEFAULTS.upstream
    anthropic_upstream: str = DEFAULTS.anthropic_upstream
    gemini_upstream: str = DEFAULTS.gemini_upstream
    store: str | None = None
    policy: str = DEFAULTS.policy
    budget: int = DEFAULTS.budget
    auth_token: str | None = None
    max_body_bytes: int = DEFAULTS.max_body_bytes
    encoding: str = DEFAULTS.encoding
    timeout: float = DEFAULTS.timeout
    policy_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    recall: bool = DEFAULTS.recall
    recall_rounds: int = DEFAULTS.recall_rounds
    recall_max_tokens: int = DEFAULTS.recall_max_tokens
    calibrate: bool = DEFAULTS.calibrate
    cache_stable: bool = DEFAULTS.cache_stable
    cache_breakpoints: bool = DEFAULTS.cache_breakpoints
    session_cache: int = DEFAULTS.session_cache
    embed_threads: int | None = None
    embedder: str = DEFAULTS.embedder

    def __post_init__(self) -> None:
        check_production(self.policy)  # PolicyError: unknown, or replay-only
        if self.embedder not in EMBEDDERS:
            raise ValueError(f"unknown embedder {self.embedder!r}; choose one of {', '.join(EMBEDDERS)}")
        if self.budget < 1:
            raise ValueError(f"budget must be a positive number of tokens, got {self.budget}")
        for name, values in self.policy_params.items():
            create(name, **values)  # PolicyError naming the policy, field and expected type
