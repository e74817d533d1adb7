"""LiteLLM: ``completion``/``acompletion`` that render the messages first, and a ``CustomLogger``
pre-call hook for the LiteLLM proxy.

>>> from historygraph.integrations.litellm import completion                     # doctest: +SKIP
>>> completion(model="gpt-4o-mini", messages=messages, budget=6000)              # doctest: +SKIP

The wrappers take LiteLLM's own arguments plus ``budget``, ``policy``, ``session``, ``store`` and
``signals`` (as :func:`historygraph.render_messages`), render ``messages`` (OpenAI form, LiteLLM's
input format) and call ``litellm.completion``/``litellm.acompletion`` with the rendered messages and
every other argument unchanged. :class:`HistoryGraphHook` does the same inside a LiteLLM proxy
(``litellm_settings: callbacks: your_module.hook`` in its config), where the session id comes from
the request's ``metadata.historygraph_session`` when given.

Recall: LiteLLM leaves running tools to the caller, so the recall tool is a definition and a helper
in that form: :data:`RECALL_TOOL` (a Chat Completions ``tools`` entry, ``historygraph_recall``) to
pass in ``tools``, and :func:`recall_results`, the ``tool`` messages answering the model's calls
to it, from the same store and session (:mod:`historygraph.render.recall`).
"""

from __future__ import annotations

from typing import Any

import litellm
from litellm.integrations.custom_logger import CustomLogger

from historygraph.api import default_store, render_messages
from historygraph.policies import DEFAULT_POLICY, Policy, Signals
from historygraph.render.recall import MAX_TOKENS, TOOL_NAME, ids_of, openai_tool, recall_stored
from historygraph.store import Store

#: The recall tool as a ``tools`` entry for :func:`completion` (OpenAI function-tool form, which
#: LiteLLM translates for every provider).
RECALL_TOOL: dict[str, Any] = openai_tool()


def completion(model: str, messages: list[dict[str, Any]], *, budget: int, policy: str | Policy = DEFAULT_POLICY,
               session: str | None = None, store: Store | None = None, signals: Signals | None = None,
               **kwargs: Any) -> Any:
    """``litellm.completion`` with ``messages`` rendered under ``budget`` tokens first.

    Raises:
        EventError, PolicyError, BudgetTooSmallError, ValueError: as :func:`historygraph.render_messages`
        (before anything is sent); LiteLLM's own errors unchanged.
    """
    out = render_messages(messages, budget=budget, policy=policy, session=session, store=store, signals=signals)
    return litellm.completion(model=model, messages=out, **kwargs)


async def acompletion(model: str, messages: list[dict[str, Any]], *, budget: int,
                      policy: str | Policy = DEFAULT_POLICY, session: str | None = None, store: Store | None = None,
                      signals: Signals | None = None, **kwargs: Any) -> Any:
    """``litellm.acompletion`` with ``messages`` rendered first (as :func:`completion`)."""
    out = render_messages(messages, budget=budget, policy=policy, session=session, store=store, signals=signals)
    return await litellm.acompletion(model=model, messages=out, **kwargs)


class HistoryGraphHook(CustomLogger):
    """A LiteLLM proxy pre-call hook: renders ``data["messages"]`` of chat completion calls.

    Args: as :func:`completion` (``budget``, ``policy``, ``store``, ``signals``); the session id is
    ``data["metadata"]["historygraph_session"]`` when present (otherwise, with a ``store``, derived
    from the conversation's start as the historygraph proxy does).
    """

    def __init__(self, budget: int, policy: str | Policy = DEFAULT_POLICY, *, store: Store | None = None,
                 signals: Signals | None = None) -> None:
        super().__init__()
        self.budget, self.policy, self.store, self.signals = budget, policy, store, signals

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict, call_type: Any) -> dict:
        if call_type not in ("completion", "acompletion") or not isinstance(data.get("messages"), list):
            return data
        session = (data.get("metadata") or {}).get("historygraph_session")
        out = render_messages(data["messages"], budget=self.budget, policy=self.policy, session=session,
                              store=self.store, signals=self.signals)
        return {**data, "messages": out}


def recall_results(message: Any, *, session: str, store: Store | None = None, max_tokens: int = MAX_TOKENS,
                   signals: Signals | None = None) -> list[dict[str, Any]]:
    """The ``tool`` messages answering the :data:`RECALL_TOOL` calls in ``message`` (the assistant
    message of a reply, ``reply.choices[0].message``, or its dict), in call order: each
    ``{"role": "tool", "tool_call_id": ..., "content": ...}`` holds the complete stored results the
    call's ids name (each cut to ``max_tokens`` tokens, marked), read from ``store`` (default the
    process's in-memory store, where :func:`completion` keeps a session given without a store) in
    ``session``, the id given to :func:`completion`. Calls to other tools are left to the caller;
    an empty list when there is no recall call. Bad ids or arguments are answered, not raised.
    """
    data = message.model_dump() if hasattr(message, "model_dump") else message
    if not isinstance(data, dict):
        raise TypeError(f"message must be an assistant message or its dict, got {type(message).__name__}")
    db = store if store is not None else default_store()
    out = []
    for call in data.get("tool_calls") or []:
        fn = call.get("function") or {}
        if fn.get("name") == TOOL_NAME:
            text = recall_stored(db, session, ids_of(fn.get("arguments")), signals.counter if signals else None, max_tokens)
            out.append({"role": "tool", "tool_call_id": call.get("id"), "content": text})
    return out
