"""OpenAI Agents SDK: a ``call_model_input_filter`` that renders the model input under a budget.

>>> from agents import RunConfig, Runner                                           # doctest: +SKIP
>>> run_config = RunConfig(call_model_input_filter=HistoryGraphInputFilter(budget=6000))  # doctest: +SKIP
>>> result = await Runner.run(agent, "…", run_config=run_config)                   # doctest: +SKIP

The SDK calls the filter before every model call with the input items (Responses API form) and the
instructions; the filter returns a new ``ModelInputData``. The run's own items are not changed.

Items → canonical events: a user/system/developer message item is one message; an assistant
``message`` item and the ``function_call`` items after it are one assistant message with tool calls
(items the SDK sends between them, such as ``reasoning``, travel with that message); a
``function_call_output`` is one tool result. The instructions are the system message (outside B).
A message shown unchanged is sent as its original items; a result a policy does not show whole as
a copy of its ``function_call_output`` item with the placeholder text as ``output``.

:meth:`HistoryGraphInputFilter.recall_tool` gives the model a way to fetch a result a placeholder
names, by its id: a ``function_tool`` (the SDK's form of a Python tool) named ``historygraph_recall``
to add to the agent's ``tools``, answered from the filter's store and session
(:mod:`historygraph.render.recall`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agents import FunctionTool, function_tool
from agents.run_config import CallModelData, ModelInputData

from historygraph.history.events import EventError, Message, ToolCall, content_text
from historygraph.api import default_store, render_events
from historygraph.policies import DEFAULT_POLICY, Policy, Signals
from historygraph.render import Rendering
from historygraph.render.recall import DESCRIPTION, MAX_TOKENS, TOOL_NAME, recall_stored
from historygraph.store import Store


@dataclass
class _Group:
    message: Message
    items: list[Any] = field(default_factory=list)


def _as_dict(item: Any) -> dict[str, Any]:
    if isinstance(item, dict):
        return item
    dump = getattr(item, "model_dump", None)
    if dump is None:
        raise EventError(f"input item must be an object, got {type(item).__name__}")
    return dump(exclude_unset=True)


def items_to_events(items: list[Any], instructions: str | None = None) -> tuple[list[Message], list[list[Any]]]:
    """Responses-API input items → ``(events, items per event)`` (see module docstring).

    Raises:
        EventError: naming ``input[i]`` and the field that is wrong.
    """
    groups: list[_Group] = [_Group(Message("system", instructions))] if instructions else []
    open_assistant: _Group | None = None
    waiting: list[Any] = []  # items (reasoning, …) that travel with the next assistant message
    for i, item in enumerate(items):
        d = _as_dict(item)
        kind, role = d.get("type"), d.get("role")
        try:
            if kind == "function_call":
                call = ToolCall(str(d["call_id"]), str(d["name"]), str(d.get("arguments") or "{}"))
                if open_assistant is None:
                    open_assistant = _Group(Message("assistant", ""), waiting)
                    groups.append(open_assistant)
                    waiting = []
                m = open_assistant.message
                open_assistant.message = Message("assistant", m.content, m.tool_calls + (call,))
                open_assistant.items.append(item)
            elif kind == "function_call_output":
                open_assistant = None
                groups.append(_Group(Message("tool", content_text(d.get("output")), tool_call_id=str(d["call_id"])), [item]))
            elif role in ("user", "system", "developer", "assistant") and kind in (None, "message"):
                text = content_text(d.get("content"))
                if role == "assistant":
                    if open_assistant is not None and not open_assistant.message.tool_calls:
                        m = open_assistant.message
                        open_assistant.message = Message("assistant", "\n".join(t for t in (m.content, text) if t))
                        open_assistant.items.append(item)
                    else:
                        open_assistant = _Group(Message("assistant", text), waiting + [item])
                        groups.append(open_assistant)
                        waiting = []
                else:
                    open_assistant = None
                    groups.append(_Group(Message("system" if role == "developer" else role, text), [item]))
            elif open_assistant is not None:
                open_assistant.items.append(item)
            else:
                waiting.append(item)
        except KeyError as exc:
            raise EventError(f"input[{i}] ({kind or role}): {exc.args[0]} is missing") from None
        except EventError as exc:
            raise EventError(f"input[{i}]: {exc}") from None
    if waiting:  # items after the last message (none in practice): they travel with it
        if not groups:
            raise EventError("input holds no message")
        groups[-1].items.extend(waiting)
    return [g.message for g in groups], [g.items for g in groups]


class HistoryGraphInputFilter:
    """A ``RunConfig.call_model_input_filter``: renders the input items with a historygraph policy.

    Args:
        budget: history budget B in tokens (instructions and the current user message are outside B).
        policy: a registered policy name or an instance from :func:`historygraph.create`.
        session, store, signals: as :func:`historygraph.render_messages`.

    Attributes:
        last_rendering: the rendering of the latest model call.
        last_session: the session id the latest model call's items were stored in (``None``
            without a store).

    Raises (from the run, wrapped by the SDK in its ``UserError``):
        EventError, PolicyError, BudgetTooSmallError: as :func:`historygraph.render_messages`.
    """

    def __init__(self, budget: int, policy: str | Policy = DEFAULT_POLICY, *, session: str | None = None,
                 store: Store | None = None, signals: Signals | None = None) -> None:
        self.budget, self.policy, self.session, self.store, self.signals = budget, policy, session, store, signals
        self.last_rendering: Rendering | None = None
        self.last_session: str | None = None

    def recall_tool(self, max_tokens: int = MAX_TOKENS) -> FunctionTool:
        """The recall tool for ``Agent(tools=[..., filter.recall_tool()])``: ``historygraph_recall(ids)``
        answers with the complete stored results the ids name (each cut to ``max_tokens`` tokens,
        marked), read from this filter's store (the process's default in-memory store when only
        ``session`` is given) in ``session``, else in the session of the latest model call.

        Raises:
            ValueError: the filter has neither ``session`` nor ``store`` (nothing is stored to recall).
        """
        if self.session is None and self.store is None:
            raise ValueError("the recall tool needs a filter with session= or store=: it reads the stored session")
        store = self.store if self.store is not None else default_store()  # where render_events stores it

        def historygraph_recall(ids: list[str]) -> str:
            """Fetch what placeholders and markers left out.

            Args:
                ids: tool result ids named by placeholders, or message spans '#A–#B' named by markers.
            """
            return recall_stored(store, self.session or self.last_session, ids,
                                 self.signals.counter if self.signals else None, max_tokens)

        return function_tool(historygraph_recall, name_override=TOOL_NAME, description_override=DESCRIPTION)

    def render(self, items: list[Any], instructions: str | None = None) -> list[Any]:
        """The input items to send for ``items``."""
        events, owned = items_to_events(items, instructions)
        rendering, self.last_session = render_events(events, budget=self.budget, policy=self.policy,
                                                     session=self.session, store=self.store, signals=self.signals)
        self.last_rendering = rendering
        out: list[Any] = []
        for m, p in zip(rendering.messages, rendering.positions):
            if m.role == "system" and (p is None or not owned[p]):
                continue  # the instructions
            if p is not None and m.rendered_as is None:
                out.extend(owned[p])
            elif m.role == "tool":
                base = _as_dict(owned[p][0]) if p is not None else {"type": "function_call_output", "call_id": m.tool_call_id}
                out.append({**base, "output": m.content})
            else:
                out.append({"role": m.role, "content": m.content})
        return out

    def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        md = data.model_data
        return ModelInputData(input=self.render(list(md.input), md.instructions), instructions=md.instructions)
