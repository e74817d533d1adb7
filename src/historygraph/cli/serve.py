"""The long-running servers: ``historygraph serve`` (the OpenAI/Anthropic-compatible proxy and the
session API, in one process or several workers) and ``historygraph mcp`` (a store's tool results
for MCP-capable agents)."""

from __future__ import annotations

import ipaddress
import json
import os
from typing import Annotated, Optional

import typer

from historygraph.cli.common import (ParamOption, ParamsFileOption, err, existing_store, fail, load_policy_params,
                                     one_budget, store_name, warn)
from historygraph.policies import PolicyError
from historygraph.server.config import DEFAULTS, masked_url
from historygraph.signals.embeddings import EMBEDDERS
from historygraph.signals.tokens import ENCODINGS


def serve(
    upstream: Annotated[str, typer.Option(help="OpenAI-compatible upstream base URL, with /v1.")] = DEFAULTS.upstream,
    anthropic_upstream: Annotated[str, typer.Option(help="Anthropic upstream base URL (/v1/messages is appended).")] = DEFAULTS.anthropic_upstream,
    gemini_upstream: Annotated[str, typer.Option(help="Gemini API upstream base URL (/v1beta/models/{model}:{method} is appended).")] = DEFAULTS.gemini_upstream,
    host: Annotated[str, typer.Option(help="Address to bind; loopback by default.")] = DEFAULTS.host,
    port: Annotated[int, typer.Option(help="Port to listen on.")] = DEFAULTS.port,
    store: Annotated[Optional[str], typer.Option(help="SQLite path, ':memory:' or postgresql://… URL. Default: $HISTORYGRAPH_DB, else historygraph.sqlite in the user data dir.")] = None,
    policy: Annotated[str, typer.Option("--policy", "-p", help="Default policy (header X-HistoryGraph-Policy overrides); rendered cache-stable unless --no-cache-stable, so 'learned' runs as learned-stable.")] = DEFAULTS.policy,
    budget_text: Annotated[str, typer.Option("--budget", "-b", help="Default history budget in tokens, a whole number >= 1 (header X-HistoryGraph-Budget overrides).")] = str(DEFAULTS.budget),
    auth_token: Annotated[Optional[str], typer.Option(envvar="HISTORYGRAPH_AUTH_TOKEN", help="Bearer token required by the session API (/api/...).")] = None,
    max_body_bytes: Annotated[int, typer.Option(min=1, help="Larger request bodies get 413.")] = DEFAULTS.max_body_bytes,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to wait for the upstream (connect and between bytes); then 502.")] = DEFAULTS.timeout,
    encoding: Annotated[str, typer.Option(help=f"Tokenizer for the budget: {', '.join(ENCODINGS)}.")] = DEFAULTS.encoding,
    log_format: Annotated[str, typer.Option(help="Log lines on stderr: 'json' (one object per line) or 'text'.")] = DEFAULTS.log_format,
    log_level: Annotated[str, typer.Option(help="Log level: DEBUG, INFO (one line per request), WARNING, ERROR.")] = DEFAULTS.log_level,
    param: ParamOption = [],
    params_file: ParamsFileOption = None,
    recall: Annotated[bool, typer.Option("--recall", help="Offer the model a tool that fetches omitted results (answered by the proxy; header X-HistoryGraph-Recall: on/off overrides). Default: off.")] = DEFAULTS.recall,
    recall_rounds: Annotated[int, typer.Option(min=1, help="Recall calls answered per request at most.")] = DEFAULTS.recall_rounds,
    stable: Annotated[bool, typer.Option("--cache-stable/--no-cache-stable", help="Between re-selections a session's rendering only appends, so the provider's prompt cache serves the previous request (once the history passes B: collects the results appended since the last collection down to 0.85·B, else re-selects to 0.75·B; docs/proxy.md). Default: on.")] = DEFAULTS.cache_stable,
    breakpoints: Annotated[bool, typer.Option("--cache-breakpoints/--no-cache-breakpoints", help="Add Anthropic prompt-cache breakpoints (cache_control) after the tools and system prompt, on the first message and on the last message of each /v1/messages request, the client's own kept, at most 4 in all (docs/proxy.md, Prompt caches). Default: on.")] = DEFAULTS.cache_breakpoints,
    calibration: Annotated[bool, typer.Option("--calibration/--no-calibration", help="Render at B shrunk by the median provider-reported / estimated prompt tokens (GET /api/calibration shows it).")] = DEFAULTS.calibrate,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes sharing the store (a SQLite file or PostgreSQL, not ':memory:'); each accepts a new connection only while it holds no more open connections than the others, so connections spread evenly (on Windows uvicorn's multi-process mode). One per core uses every core. Each worker keeps its own warm sessions and catches a session up from the store by its length when another worker appended to it; appends are checked against the stored length inside the store's write transaction.")] = DEFAULTS.workers,
    embedder: Annotated[str, typer.Option(help=f"Sentence embedder of the policies that embed: {', '.join(EMBEDDERS)} (docs/proxy.md, docs/evaluator.md Embedders; the proxy's default is wordllama, the replays' minilm; 'static' needs historygraph\\[static], 'wordllama' historygraph\\[wordllama]).")] = DEFAULTS.embedder,
    public_without_auth: Annotated[bool, typer.Option("--public-without-auth", help="Allow a --host other than loopback without --auth-token (the session API then serves every stored session to anyone who can reach the port).")] = False,
    session_cache: Annotated[int, typer.Option(min=0, help="Open sessions each worker keeps warm (their graphs, the client messages last stored and, for /v1/messages, the wire turns last converted, so a re-sent history is recognised by its bytes without parsing it); least recently used dropped first; 0: no messages or turns remembered.")] = DEFAULTS.session_cache,
) -> None:
    """Run the OpenAI/Anthropic/Gemini-compatible proxy and the session API (needs the 'server' extra)."""
    budget = one_budget(budget_text)
    if not auth_token and not is_loopback(host):
        if not public_without_auth:
            fail(f"--host {host} accepts connections from other machines, and without --auth-token the session API "
                 f"(/api/sessions: every stored session, tool results included) is open to them: pass --auth-token TOKEN "
                 f"(or set HISTORYGRAPH_AUTH_TOKEN), bind 127.0.0.1, or add --public-without-auth if that is intended")
        warn(f"the session API on {host}:{port} needs no token (--public-without-auth): anyone who can reach the "
             f"port can read every stored session")
    try:
        import uvicorn

        from historygraph.server.app import create_app
        from historygraph.server.config import ServerConfig
        from historygraph.server.logs import configure as configure_logs
    except ImportError as exc:
        fail(f"the server needs the 'server' extra: run `bash scripts/setup.sh server` in the historygraph clone "
             f"(or pip install -e '.[server]' in its .venv): {exc}")
    if encoding not in ENCODINGS:
        fail(f"unknown encoding {encoding!r}; choose one of {', '.join(ENCODINGS)}")
    if log_format not in ("json", "text"):
        fail(f"--log-format must be 'json' or 'text', got {log_format!r}")
    if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        fail(f"--log-level must be DEBUG, INFO, WARNING or ERROR, got {log_level!r}")
    configure_logs(log_level, json=log_format == "json")
    dotted = [k.partition("=")[0].rpartition(".")[0] for k in param]
    params = load_policy_params(param, params_file, list(dict.fromkeys([policy] + [d for d in dotted if d])))
    try:
        config = ServerConfig(upstream=upstream, anthropic_upstream=anthropic_upstream, gemini_upstream=gemini_upstream, store=store, policy=policy,
                              budget=budget, auth_token=auth_token, max_body_bytes=max_body_bytes, encoding=encoding,
                              timeout=timeout, policy_params=params, recall=recall, recall_rounds=recall_rounds,
                              calibrate=calibration, cache_stable=stable, cache_breakpoints=breakpoints, session_cache=session_cache, embedder=embedder,
                              # each worker's embedder gets its share of the cores (none competes for all of them)
                              embed_threads=max(1, (os.cpu_count() or 1) // workers) if workers > 1 else None)
        application = create_app(config)
    except (PolicyError, ValueError) as exc:
        fail(str(exc))
    except Exception as exc:  # an unreachable database, an unwritable path
        fail(f"cannot open store {store or 'default'}: {type(exc).__name__}: {exc}")
    err.print(f"historygraph proxy on http://{host}:{port} → {masked_url(upstream)} | {masked_url(anthropic_upstream)} | {masked_url(gemini_upstream)}; policy {policy}"
              f"{' (cache-stable: sessions record it as ' + policy + '-stable)' if config.cache_stable and policy != 'full' else ''}, "
              f"budget {budget}; store {getattr(application.state.proxy.store, 'path', ':memory:')}")
    if workers == 1:
        from historygraph.server.app import tune_gc

        tune_gc()
        uvicorn.run(application, host=host, port=port, log_level="warning")
        return
    _serve_workers(application, config, store, workers, host, port, log_level, log_format)


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` accepts connections from this machine only: ``localhost`` or a
    loopback address (127.0.0.0/8, ``::1``); a name or an address of an interface is not."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _serve_workers(application, config, store: str | None, workers: int, host: str, port: int, log_level: str,  # noqa: ANN001
                   log_format: str) -> None:
    """``serve --workers N`` (N > 1): the configuration handed to the worker processes through the
    environment, each opening its own store connection, under historygraph's balanced supervisor
    (or uvicorn's where it is unavailable)."""
    import uvicorn

    if store == ":memory:":
        fail("--workers > 1 needs a store the workers share (a SQLite file or postgresql://…), not ':memory:'")
    import dataclasses

    from historygraph.server.config import CONFIG_ENV, LOG_ENV

    application.state.proxy.store.close()  # each worker opens its own connection
    os.environ[CONFIG_ENV] = json.dumps(dataclasses.asdict(config))
    os.environ[LOG_ENV] = json.dumps({"level": log_level, "json": log_format == "json"})
    from historygraph.server.workers import BALANCED, run_workers

    if not BALANCED:  # uvicorn's supervisor (historygraph.server.workers)
        uvicorn.run("historygraph.server.app:create_app_from_env", factory=True, workers=workers, host=host, port=port,
                    log_level="warning")
        return
    try:
        status = run_workers("historygraph.server.app:create_app_from_env", workers, host, port)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc}")
    if status:
        raise typer.Exit(status)


def mcp_command(
    session: Annotated[Optional[str], typer.Option(help="The session the tools read; a call naming another is refused unless --all-sessions.")] = None,
    all_sessions: Annotated[bool, typer.Option("--all-sessions", help="Let each tool call read any session of the store (session=...); without it the server is confined to --session.")] = False,
    store: Annotated[Optional[str], typer.Option(help="Store path or postgresql:// URL. Default: $HISTORYGRAPH_DB, else historygraph.sqlite in the user data dir.")] = None,
    http: Annotated[bool, typer.Option("--http", help="Serve streamable HTTP on --host/--port (without it: stdio).")] = False,
    host: Annotated[str, typer.Option(help="Address for --http; loopback by default.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port for --http.")] = 8643,
) -> None:
    """Serve a store's tool results to MCP-capable agents (tools results, recall, search; needs the 'mcp' extra)."""
    try:
        from historygraph.integrations.mcp import build_server
    except ImportError as exc:
        fail(f"the MCP server needs the 'mcp' extra (pip install -e '.[mcp]' in the historygraph clone): {exc}")
    if session is None and not all_sessions:
        fail("mcp needs --session SESSION (the one session its tools read), or --all-sessions to let each tool call "
             "read any session of the store")
    db = existing_store(store)
    if session is not None and not db.has_session(session):  # served as empty until its first request is stored
        warn(f"no session {session!r} in {store_name(db)} yet: the tools answer for it once its first request is "
             f"stored (historygraph sessions --store {store_name(db)} lists the stored ones)")
    server = build_server(db, session, all_sessions=all_sessions)
    if http:
        server.run("streamable-http", host=host, port=port)
    else:
        server.run("stdio")

