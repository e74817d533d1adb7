"""``historygraph serve``: an OpenAI-, Anthropic- and Gemini-compatible proxy with a session API.

Modules: :mod:`.config` (ServerConfig and the table of serve defaults; light, no FastAPI),
:mod:`.app` (create_app: the ASGI app, middleware, lifespan), :mod:`.proxy` (the per-request
pipeline), :mod:`.chat`, :mod:`.messages`, :mod:`.responses`, :mod:`.gemini` (one module per provider API),
:mod:`.errors` (provider-shaped errors), :mod:`.api` (session API), :mod:`.upstream` (headers, SSE
parsing, stream accumulation), :mod:`.convert` (the wire endpoints' conversion steps; the
Anthropic endpoint's :class:`~.convert.TurnCache`); session ids, diffing and branches live in
:mod:`historygraph.history.sessions`. The fake provider the tests and benchmarks run lives in
tests/fake_upstream.py (a test double, not installed). Needs the ``server`` extra (fastapi,
uvicorn; psycopg for PostgreSQL), except :mod:`.config`. Nothing is imported eagerly here: import
each name from the module that holds it.
"""
