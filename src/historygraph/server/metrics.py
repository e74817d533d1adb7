"""Prometheus metrics of one proxy instance (``GET /metrics``, text exposition format).

Each :class:`ProxyMetrics` has its own ``prometheus_client.CollectorRegistry`` (several apps in one
process, as in tests, never share counts). Metric names follow Prometheus conventions (base
units, ``_total`` counters):

* ``historygraph_requests_total{api, status}``: proxied requests by API (``openai``/``anthropic``/``responses``/``gemini``)
  and HTTP status returned to the client;
* ``historygraph_render_seconds{policy}``: histogram of the time to render one request's history
  (ingest excluded);
* ``historygraph_history_tokens_in_total{policy}``: tokens of the complete stored history the
  renderings were made from, ``historygraph_history_tokens_out_total{policy}``: tokens of the
  rendered history sent (charged to B), ``historygraph_tokens_saved_total{policy}``: in − out;
  what B covers (system and current user messages are outside it) is ContextRender (arXiv
  2609.37743) Appendix A.4; tokens of the proxy's tokenizer;
* ``historygraph_calibration_ratio``: median of provider-reported / our-estimated prompt tokens
  over the recent window (:class:`~historygraph.signals.calibration.TokenCalibration`; 1.0 before
  any observation), ``historygraph_calibration_observations``;
* ``historygraph_input_tokens_total{api, kind}``: prompt tokens the upstream reported for the
  answers (``usage``, streamed or not), by how the provider billed them: ``cache_read`` (read from
  its prompt cache: Anthropic ``cache_read_input_tokens``, Chat Completions
  ``prompt_tokens_details.cached_tokens``, Responses ``input_tokens_details.cached_tokens``),
  ``cache_write`` (Anthropic ``cache_creation_input_tokens``; OpenAI reports none) and
  ``uncached`` (the rest: Anthropic ``input_tokens``, OpenAI the prompt tokens less the cached);
  provider tokens, not the proxy's. Totals per API, not per session: a session label would add
  series without bound (Prometheus, "Naming": "do not use labels to store dimensions with high
  cardinality"); the session API's ``GET /api/calibration`` sums the same parts over its window;
* ``historygraph_recall_calls_total{api}``: calls of the recall tool the proxy answered
  (:mod:`historygraph.server.recall_tool`);
* ``historygraph_over_budget_total{policy}``: requests forwarded over B because the part every
  rendering must keep exceeded it (the smallest valid rendering is sent; docs/proxy.md);
* ``historygraph_upstream_errors_total{api, kind}``: upstream answers with status ≥ 400 (kind =
  the status code), unreachable upstreams (``unreachable``), streams cut mid-way (``stream_cut``),
  non-streamed bodies cut after the headers (``body_cut``), 2xx bodies that are not JSON
  (``not_json``) and streams whose answer cannot be read (``malformed_stream``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from historygraph.history.graph import ContextGraph
from historygraph.render import Rendering
from historygraph.signals.calibration import TokenCalibration, Usage
from historygraph.signals.tokens import TokenCounter

# render times seen on 2 cores range from ~1 ms (short sessions) to seconds (summarising policies)
RENDER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


_RUNNING = "metrics.history_tokens"  # graph.memo key: {"sum": (counter, messages counted, their tokens, latest user)}


def full_history_tokens(graph: ContextGraph, counter: TokenCounter) -> int:
    """Tokens of the complete stored history charged to B if shown whole: every message except
    system messages and the latest user message (the same scope as the budget check).

    Kept as a running sum per graph (graphs are append-only), so each call counts only the
    messages appended since the last: O(new messages), not O(history), per proxied request."""
    running: dict[str, tuple[TokenCounter, int, int, int | None]] = graph.memo(_RUNNING, dict)
    hit = running.get("sum")
    done, total, last_user = (hit[1], hit[2], hit[3]) if hit is not None and hit[0] is counter else (0, 0, None)
    msgs = graph.messages
    for p in range(done, len(msgs)):
        m = msgs[p]
        if m.role != "system":
            total += counter.count_message(m)
        if m.role == "user":
            last_user = p
    running["sum"] = (counter, len(msgs), total, last_user)
    return total - (counter.count_message(msgs[last_user]) if last_user is not None else 0)


class ProxyMetrics:
    """The proxy's counters; see the module docstring for names and labels."""

    def __init__(self, calibration: TokenCalibration | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("historygraph_requests", "Proxied requests by API and status returned",
                                ["api", "status"], registry=r)
        self.render_seconds = Histogram("historygraph_render_seconds", "Time to render one request's history",
                                        ["policy"], buckets=RENDER_BUCKETS, registry=r)
        self.tokens_in = Counter("historygraph_history_tokens_in", "Tokens of the complete stored history rendered",
                                 ["policy"], registry=r)
        self.tokens_out = Counter("historygraph_history_tokens_out", "Tokens of the rendered history sent (charged to B)",
                                  ["policy"], registry=r)
        self.tokens_saved = Counter("historygraph_tokens_saved", "History tokens not sent (in - out)",
                                    ["policy"], registry=r)
        self.input_tokens = Counter("historygraph_input_tokens", "Prompt tokens the upstream reported, by cache kind",
                                    ["api", "kind"], registry=r)
        self.recall_calls = Counter("historygraph_recall_calls", "Recall tool calls the proxy answered", ["api"], registry=r)
        self.over_budget = Counter("historygraph_over_budget", "Requests forwarded over B: the protected history alone exceeded it",
                                   ["policy"], registry=r)
        self.upstream_errors = Counter("historygraph_upstream_errors", "Upstream errors by API and kind",
                                       ["api", "kind"], registry=r)
        if calibration is not None:
            Gauge("historygraph_calibration_ratio", "Median provider-reported / estimated prompt tokens",
                  registry=r).set_function(lambda: calibration.ratio)
            Gauge("historygraph_calibration_observations", "Usage reports the calibration ratio is based on",
                  registry=r).set_function(lambda: calibration.summary()["observations"])

    def observe_render(self, policy: str, seconds: float, rendering: Rendering, graph: ContextGraph,
                       counter: TokenCounter) -> tuple[int, int]:
        """Record one rendering; returns ``(history tokens in, out)``."""
        tokens_in = full_history_tokens(graph, counter)
        tokens_out = rendering.history_tokens
        self.render_seconds.labels(policy).observe(seconds)
        self.tokens_in.labels(policy).inc(tokens_in)
        self.tokens_out.labels(policy).inc(tokens_out)
        self.tokens_saved.labels(policy).inc(max(0, tokens_in - tokens_out))
        return tokens_in, tokens_out

    def observe_usage(self, api: str, usage: Usage) -> None:
        """Add one answer's reported prompt tokens to ``historygraph_input_tokens_total``."""
        for kind, n in (("cache_read", usage.cache_read), ("cache_write", usage.cache_write), ("uncached", usage.fresh)):
            self.input_tokens.labels(api, kind).inc(n)

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """Every metric in the format the scraper's ``Accept`` header asks for (prometheus_client's
        negotiation: the text format by default, OpenMetrics when asked) and its content type."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
