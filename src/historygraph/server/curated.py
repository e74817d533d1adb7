"""Clients that curate their own context (docs/proxy.md, "Clients that curate their own context"):
the rule by which the proxy forwards such a request as sent instead of rendering it under B."""

from __future__ import annotations

from typing import Sequence

from historygraph.history.events import Message
from historygraph.history.sessions import Ingest


def client_curated(messages: Sequence[Message], ingest: Ingest) -> bool:
    """Whether the request comes from a client that curates its own context (aider and any chat
    client without tool calls that restates files, a repository map or summaries in every
    request): no tool call, tool result or provider block (a server tool's call and result, a
    thinking block: what a model made, not what such a client writes) anywhere in it, and it continues no stored session (a
    new session or chat, or a branch: the client rewrote earlier messages, as aider re-sends its
    repository map and the files it edits, as they are now, before the new turn; aider's first
    request already holds them, after a fixed example exchange: a new session counts when it
    holds an assistant message). Such a request's messages are what the client chose to show for
    this call, so the proxy stores them and forwards them as sent instead of rendering them under
    B (docs/proxy.md, "Clients that curate their own context"). An agent's tool loop, and a
    conversation that only grows, continue their session and are rendered."""
    if not ingest.created:
        return False  # a continuation of what is stored: rendered as usual
    if ingest.forked_from is None and not any(m.role == "assistant" for m in messages):
        return False  # a conversation's opening (system and user messages): nothing the client curated
    return not any(m.role == "tool" or m.tool_calls or m.provider_blocks for m in messages)
