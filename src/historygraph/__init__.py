"""historygraph: a persistent context graph for LLM agents, rendered under a token budget.

The curated public API (checked by a test): value types, the context graph, stores, policies and
the replay evaluator. See docs/architecture.md for the architecture.
"""

from historygraph.history.events import EventError, Message, ToolCall, Trace
from historygraph.history.graph import ContextGraph, GraphError
from historygraph.api import Rendered, render_anthropic_messages, render_messages, render_responses_input
from historygraph.policies import REGISTRY, PolicyError, Signals, create
from historygraph.render import BudgetTooSmallError, InvariantError, Rendering, check_invariants
from historygraph.session import Session
from historygraph.signals.tokens import TokenCounter
from historygraph.store import MemoryStore, SQLiteStore, open_store

__version__ = "0.1.0"

__all__ = [
    "BudgetTooSmallError", "ContextGraph", "EventError", "GraphError", "InvariantError", "MemoryStore", "Message",
    "PolicyError", "REGISTRY", "Rendered", "Rendering", "SQLiteStore", "Session", "Signals", "TokenCounter", "ToolCall", "Trace",
    "check_invariants", "create", "open_store", "render_anthropic_messages", "render_messages",
    "render_responses_input", "__version__",
]
