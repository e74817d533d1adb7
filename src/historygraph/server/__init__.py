"""``historygraph serve``: an OpenAI- and Anthropic-compatible proxy with a session API.

Modules: :mod:`.app` (config, proxy endpoints), :mod:`.api` (session API), :mod:`.sessions`
(session ids, diffing, branches), :mod:`.upstream` (headers, SSE parsing, stream accumulation),
the fake provider the tests and benchmarks run lives in tests/fake_upstream.py (a test double, not installed).
Needs the ``server`` extra (fastapi, uvicorn; psycopg for PostgreSQL).
"""

from historygraph.server.app import ServerConfig, create_app

__all__ = ["ServerConfig", "create_app"]
