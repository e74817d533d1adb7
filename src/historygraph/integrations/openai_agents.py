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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agents.run_config import CallModelData, ModelInputData

from historygraph.history.events import EventError, Message, ToolCall, content_text
from historygraph.api import render_events
from historygraph.policies import DEFAULT_POLICY, Policy, Signals
from historygraph.render import Rendering
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

    Raises (from the run, wrapped by the SDK in its ``UserError``):
        EventError, PolicyError, BudgetTooSmallError: as :func:`historygraph.render_messages`.
    """

    def __init__(self, budget: int, policy: str | Policy = DEFAULT_POLICY, *, session: str | None = None,
                 store: Store | None = None, signals: Signals | None = None) -> None:
        self.budget, self.policy, self.session, self.store, self.signals = budget, policy, session, store, signals
        self.last_rendering: Rendering | None = None

    def render(self, items: list[Any], instructions: str | None = None) -> list[Any]:
        """The input items to send for ``items``."""
        events, owned = items_to_events(items, instructions)
        rendering, _ = render_events(events, budget=self.budget, policy=self.policy, session=self.session,
                                     store=self.store, signals=self.signals)
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
