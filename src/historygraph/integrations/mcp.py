"""``historygraph mcp``: an MCP server (the official ``mcp`` SDK, ``MCPServer``) that lets an
MCP-capable agent read the tool results stored in a session, including those a rendering omitted.

Tools (``session`` defaults to the one given with ``--session``; the server is confined to that
session, and a call naming another is a tool error, unless it was started with ``--all-sessions``,
so that an agent a prompt injection steers cannot read the other sessions of the store):

* ``results(session)``: every stored tool result: id, tool name, tokens, first line;
* ``recall(ids, session)``: the complete stored text of those results (ids as named by the
  placeholders ``[tool result ID omitted from this context …]``); an unknown id is said so;
* ``search(query, session, limit=5)``: the results BM25 ranks best for ``query`` (``bm25s``, English
  stop words removed, as the ``cw-bm25`` policy), with their scores and first lines; results that
  share no term with the query are not returned.

The store is opened once per server and read on every call, so results appended meanwhile (by a
proxy or a replay sharing the store) are seen. Transport: stdio (what agents launch), or
streamable HTTP with ``--http``.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from historygraph.history.graph import ContextGraph
from historygraph.policies.baselines.retrieval import bm25_scores
from historygraph.render.recall import recall_text
from historygraph.signals.tokens import TokenCounter
from historygraph.store import Store

INSTRUCTIONS = ("Tool results of this agent's session are stored in full by historygraph. When the "
                "conversation shows '[tool result ID omitted from this context ...]', call recall with those ids "
                "to read the complete results; for an '[omitted: messages #A–#B ...]' marker pass '#A–#B' to read "
                "those messages; use search to find results by content.")


def _first_line(text: str, width: int = 120) -> str:
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    return line[:width]


def build_server(store: Store, session: str | None = None, counter: TokenCounter | None = None, *,
                 all_sessions: bool = False) -> MCPServer:
    """The MCP server over ``store``; ``session`` is the default session of every tool.

    The tools read ``session`` only: a call naming another session is a tool error (``is_error``)
    saying the server is confined to it, unless ``all_sessions`` is true; then a call may name any
    session of the store, and one that is not in the store, or none where no ``session`` was given,
    is a tool error saying how to list them. No ``session`` and not ``all_sessions`` is a
    ``ValueError`` (there would be nothing to serve). ``session`` itself, not stored yet, is served as
    an empty one (no results; a recalled id is said to be unknown), so an agent can be started
    with ``--session`` before its first request reaches the proxy: what the proxy stores from then
    on is read on the next call.
    """
    if session is None and not all_sessions:
        raise ValueError("build_server needs the session to confine the server to, or all_sessions=True to let "
                         "each call name any session of the store")
    counter = counter or TokenCounter()
    server: MCPServer = MCPServer("historygraph", instructions=INSTRUCTIONS)

    def graph(sid: str | None) -> Any:
        sid = sid or session
        if sid != session and not all_sessions:
            raise ToolError(f"this server is confined to session {session!r} and cannot read session {sid!r}: "
                            f"omit session=..., or start it with --all-sessions to read every session of the store")
        if not sid:
            raise ToolError("no session given: pass session=... (historygraph sessions lists them)")
        if not store.has_session(sid):
            if sid == session:  # the server's own session, not stored yet: it appears with its first request
                return ContextGraph(sid)
            raise ToolError(f"no session {sid!r} in the store (historygraph sessions lists them)")
        return store.graph(sid)

    @server.tool()
    def results(session: str | None = None) -> list[dict[str, Any]]:
        """Every stored tool result of the session: id, tool, tokens, first line."""
        g = graph(session)
        names = {c.id: c.name for m in g.messages for c in m.tool_calls}
        return [{"id": g.messages[p].tool_call_id, "tool": names.get(g.messages[p].tool_call_id or "", ""),
                 "tokens": counter.count(g.messages[p].content), "first_line": _first_line(g.messages[p].content)}
                for p in g.results()]

    @server.tool()
    def recall(ids: list[str], session: str | None = None) -> str:
        """The complete stored text of tool results, by the ids their placeholders name, or of the
        messages a dropped-step marker names (``"#A–#B"``)."""
        return recall_text(graph(session), ids)

    @server.tool()
    def search(query: str, session: str | None = None, limit: int = 5) -> list[dict[str, Any]]:
        """The stored tool results that match ``query`` best (BM25), best first."""
        g = graph(session)
        positions = g.results()
        if not positions or not query.strip():
            return []
        scores = bm25_scores([g.messages[p].content for p in positions], query)
        order = sorted((i for i in range(len(positions)) if scores[i] > 0), key=lambda i: (-scores[i], -i))
        return [{"id": g.messages[positions[i]].tool_call_id, "score": round(float(scores[i]), 3),
                 "first_line": _first_line(g.messages[positions[i]].content)} for i in order[:max(1, limit)]]

    return server
