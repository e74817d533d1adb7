"""LangChain v1 agents: a middleware that renders the model input under a token budget.

>>> from langchain.agents import create_agent                           # doctest: +SKIP
>>> agent = create_agent(model, tools, middleware=[HistoryGraphMiddleware(budget=6000)])  # doctest: +SKIP

LangChain's convention for changing what the model sees without changing the agent's state is
``wrap_model_call`` (as its ``ContextEditingMiddleware`` does): the state keeps every message,
the model gets ``request.override(messages=...)``. Messages are converted with
``langchain_core.messages.convert_to_openai_messages``; a message shown unchanged is passed as the
original LangChain object, a result a policy does not show whole as a copy of its ``ToolMessage``
with the placeholder text, and messages a policy adds (summaries) as new messages. The system
message is outside the budget and passed on unchanged.

With ``recall=True`` the middleware also registers a tool, ``historygraph_recall`` (a LangChain
``StructuredTool``; middleware tools are LangChain's way for a middleware to give the agent a tool,
``AgentMiddleware.tools``), with which the model fetches a result a placeholder names by its id,
from the same store and session the middleware renders from (:mod:`historygraph.render.recall`).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Sequence

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import AnyMessage, BaseMessage, ToolMessage, convert_to_messages, convert_to_openai_messages
from langchain_core.tools import StructuredTool

from historygraph.history.events import EventError, Message
from historygraph.api import default_store, render_events
from historygraph.policies import DEFAULT_POLICY, Policy, Signals
from historygraph.render import Rendering
from historygraph.render.recall import DESCRIPTION, MAX_TOKENS, PARAMETERS, TOOL_NAME, recall_stored
from historygraph.store import Store


class HistoryGraphMiddleware(AgentMiddleware):
    """Renders ``request.messages`` with a historygraph policy before each model call.

    Args:
        budget: history budget B in tokens (system and current user messages are outside B).
        policy: a registered policy name or an instance from :func:`historygraph.create`.
        session, store: as :func:`historygraph.render_messages` (store every call's new messages
            in a session, e.g. to fetch omitted results by id later); default nothing stored. With a
            ``store`` and no ``session``, the run's LangGraph ``thread_id`` (``config={"configurable":
            {"thread_id": ...}}``) names the session when there is one.
        signals: shared signal providers.
        recall: register the recall tool (``self.tools``), answered from ``store`` (the process's
            default in-memory store when only ``session`` is given) and the session of the run: ``session``,
            else the run's ``thread_id``, else the session the latest model call was stored in.
        recall_max_tokens: tokens of one recalled result shown at most (longer ones are cut, marked).

    Attributes:
        last_rendering: the :class:`~historygraph.render.Rendering` of the latest model call.
        last_session: the session id the latest model call's messages were stored in (``None``
            without a store).

    Raises:
        ValueError: ``recall=True`` with neither ``session`` nor ``store`` (nothing would be stored
            to recall).
        EventError, PolicyError, BudgetTooSmallError (from the model call): as
            :func:`historygraph.render_messages`.
    """

    def __init__(self, budget: int, policy: str | Policy = DEFAULT_POLICY, *, session: str | None = None,
                 store: Store | None = None, signals: Signals | None = None, recall: bool = False,
                 recall_max_tokens: int = MAX_TOKENS) -> None:
        super().__init__()
        if recall and session is None and store is None:
            raise ValueError("recall=True needs session= or store=: the recall tool reads the stored session")
        if recall and store is None:
            store = default_store()  # where render_events stores a session given without a store
        self.budget, self.policy, self.session, self.store, self.signals = budget, policy, session, store, signals
        self.recall_max_tokens = recall_max_tokens
        self.last_rendering: Rendering | None = None
        self.last_session: str | None = None
        self.tools = [self._recall_tool(store)] if store is not None and recall else []

    def _recall_tool(self, store: Store) -> StructuredTool:
        def historygraph_recall(ids: list[str]) -> str:
            session = self.session or _thread_id() or self.last_session
            return recall_stored(store, session, ids, self.signals.counter if self.signals else None,
                                 self.recall_max_tokens)

        return StructuredTool.from_function(historygraph_recall, name=TOOL_NAME, description=DESCRIPTION,
                                            args_schema=PARAMETERS)

    def render(self, messages: Sequence[BaseMessage], system: BaseMessage | None = None) -> list[AnyMessage]:
        """The LangChain messages to send for ``messages`` (``system`` is not returned)."""
        given = ([system] if system is not None else []) + list(messages)
        events = []
        for i, d in enumerate(convert_to_openai_messages(given)):
            try:
                events.append(Message.from_openai(d))
            except EventError as exc:
                raise EventError(f"messages[{i}]: {exc}") from None
        session = self.session or (_thread_id() if self.store is not None else None)
        rendering, self.last_session = render_events(events, budget=self.budget, policy=self.policy, session=session,
                                                     store=self.store, signals=self.signals)
        self.last_rendering = rendering
        out: list[Any] = []
        for m, p in zip(rendering.messages, rendering.positions):
            original = given[p] if p is not None else None
            if original is system and system is not None:
                continue
            if original is not None and m.rendered_as is None:
                out.append(original)
            elif isinstance(original, ToolMessage):
                out.append(original.model_copy(update={"content": m.content, "artifact": None}))
            else:
                out.extend(convert_to_messages([m.to_openai()]))
        return out

    def wrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]) -> Any:
        if not request.messages:
            return handler(request)
        return handler(request.override(messages=self.render(request.messages, request.system_message)))

    async def awrap_model_call(self, request: ModelRequest,
                               handler: Callable[[ModelRequest], Awaitable[ModelResponse]]) -> Any:
        if not request.messages:
            return await handler(request)
        return await handler(request.override(messages=self.render(request.messages, request.system_message)))


def _thread_id() -> str | None:
    """The ``thread_id`` of the LangGraph run this call is part of, if any."""
    try:
        from langgraph.config import get_config

        value = (get_config().get("configurable") or {}).get("thread_id")
    except (ImportError, RuntimeError):  # no run context (a direct call of render)
        return None
    return str(value) if value is not None else None
