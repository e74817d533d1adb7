"""LiteLLM: ``completion``/``acompletion`` that render the messages first, and a ``CustomLogger``
pre-call hook for the LiteLLM proxy.

>>> from historygraph.integrations.litellm import completion                     # doctest: +SKIP
>>> completion(model="gpt-4o-mini", messages=messages, budget=6000)              # doctest: +SKIP

The wrappers take LiteLLM's own arguments plus ``budget``, ``policy``, ``session``, ``store`` and
``signals`` (as :func:`historygraph.render_messages`), render ``messages`` (OpenAI form, LiteLLM's
input format) and call ``litellm.completion``/``litellm.acompletion`` with the rendered messages and
every other argument unchanged. :class:`HistoryGraphHook` does the same as a LiteLLM callback, for
the three APIs LiteLLM serves (Chat Completions, Anthropic Messages, Responses): in a LiteLLM
proxy (``litellm_settings: callbacks: your_module.hook`` in its config) and in the SDK
(``litellm.callbacks = [hook]``; async calls only: a synchronous ``litellm.completion`` is sent
whole, with a warning), where the session id comes from the request's
``metadata.historygraph_session`` when given.

Recall: LiteLLM leaves running tools to the caller, so the recall tool is a definition and a helper
in that form: :data:`RECALL_TOOL` (a Chat Completions ``tools`` entry, ``historygraph_recall``) to
pass in ``tools``, and :func:`recall_results`, the ``tool`` messages answering the model's calls
to it, from the same store and session (:mod:`historygraph.render.recall`).
"""

from __future__ import annotations

import warnings
from contextvars import ContextVar
from typing import Any

import litellm
from litellm.integrations.custom_logger import CustomLogger

from historygraph.api import default_store, render_anthropic_messages, render_messages, render_responses_input
from historygraph.providers.openai_responses import passthrough_reason
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
    token = _RENDERED.set(True)  # a HistoryGraphHook also registered need not warn that it did not render this call
    try:
        return litellm.completion(model=model, messages=out, **kwargs)
    finally:
        _RENDERED.reset(token)


async def acompletion(model: str, messages: list[dict[str, Any]], *, budget: int,
                      policy: str | Policy = DEFAULT_POLICY, session: str | None = None, store: Store | None = None,
                      signals: Signals | None = None, **kwargs: Any) -> Any:
    """``litellm.acompletion`` with ``messages`` rendered first (as :func:`completion`)."""
    out = render_messages(messages, budget=budget, policy=policy, session=session, store=store, signals=signals)
    return await litellm.acompletion(model=model, messages=out, **kwargs)


#: LiteLLM's call types (``litellm.types.utils.CallTypes`` values) of each API the hook renders.
CHAT_CALLS = frozenset({"completion", "acompletion"})
ANTHROPIC_CALLS = frozenset({"anthropic_messages", "aanthropic_messages"})
RESPONSES_CALLS = frozenset({"responses", "aresponses"})
SESSION_KEY = "historygraph_session"
#: The call type of a synchronous ``litellm.completion`` (also the chat call a synchronous
#: ``litellm.anthropic.messages.create`` is carried out by): LiteLLM runs no pre-call hook for it.
SYNC_CALL = "completion"
SYNC_WARNING = ("historygraph's HistoryGraphHook did not render a synchronous litellm.completion call: LiteLLM runs "
                "no pre-call hook for synchronous calls, so the whole history was sent. Use litellm.acompletion "
                "(async calls are rendered), or historygraph.integrations.litellm.completion, which renders before "
                "calling litellm.completion (docs/library.md, LiteLLM). Said once per hook.")
_RENDERED: ContextVar[bool] = ContextVar("historygraph_litellm_rendered", default=False)  # set by completion()


class HistoryGraphHook(CustomLogger):
    """A LiteLLM callback that renders the history of every Chat Completions, Anthropic Messages
    and Responses call, in the LiteLLM proxy and in the SDK.

    What it rewrites, by LiteLLM call type: ``completion``/``acompletion``: ``messages`` (OpenAI
    form, :func:`historygraph.render_messages`); ``anthropic_messages`` (the proxy's
    ``/v1/messages``, ``litellm.anthropic.messages.acreate``): ``messages`` with ``system``
    outside B (:func:`historygraph.render_anthropic_messages`); ``responses``/``aresponses``:
    ``input`` with ``instructions`` outside B (:func:`historygraph.render_responses_input`),
    except a request naming provider-kept state (``previous_response_id``, ``conversation``),
    which is left as it is, as the historygraph proxy does. Every other call and field is
    unchanged.

    Where LiteLLM calls it (the installed LiteLLM's ``CustomLogger``):

    * :meth:`async_pre_call_hook`: the proxy's pre-call hook, per request on every route
      (https://docs.litellm.ai/docs/proxy/call_hooks);
    * :meth:`async_pre_call_deployment_hook`: LiteLLM's hook for changing a request just before it
      is sent, run for every async SDK call (``acompletion``, ``aresponses``,
      ``anthropic.messages.acreate``) and for ``responses``. It skips a call the proxy made (its
      ``proxy_server_request``, which the proxy sets and strips from clients: the pre-call hook
      rendered that one) and a call LiteLLM made to carry out another (a Responses or Anthropic
      call bridged to a chat completion: its logging object keeps the outer call type), so no
      request is rendered twice.

    LiteLLM (as installed, 1.110) runs no pre-call hook at all for a synchronous
    ``litellm.completion`` (nor for the chat call that carries out a synchronous
    ``litellm.anthropic.messages.create``): such a call is sent whole. The hook sees it only in
    LiteLLM's logging callbacks (:meth:`log_pre_api_call` before it is sent, where the provider's
    route logs one, else :meth:`logging_hook` after) and warns once (:data:`SYNC_WARNING`, a
    ``RuntimeWarning``); use :func:`completion` or ``litellm.acompletion`` there. Under
    ``mock_response`` nothing is sent: an async call is rendered (and stored) as any other, a
    synchronous one is not and warns as above; LiteLLM's ``log_pre_api_call`` callbacks are handed
    the messages as the caller passed them, not the rendered ones, either way.

    Args: as :func:`completion` (``budget``, ``policy``, ``store``, ``signals``); the session id is
    ``historygraph_session`` in the request's ``metadata`` (or the proxy's ``litellm_metadata``)
    when present (otherwise, with a ``store``, derived from the conversation's start as the
    historygraph proxy does). The key is removed from the ``metadata`` of an Anthropic Messages
    request, whose ``metadata`` the provider accepts only ``user_id`` in.

    Raises (from the hooks, before anything is sent):
        EventError, PolicyError, BudgetTooSmallError: as :func:`historygraph.render_messages`.
    """

    def __init__(self, budget: int, policy: str | Policy = DEFAULT_POLICY, *, store: Store | None = None,
                 signals: Signals | None = None) -> None:
        super().__init__()
        self.budget, self.policy, self.store, self.signals = budget, policy, store, signals
        self.warned_sync = False  # SYNC_WARNING given

    def log_pre_api_call(self, model: Any, messages: Any, kwargs: Any) -> None:
        self._unrendered(kwargs.get("call_type") if isinstance(kwargs, dict) else None)

    def logging_hook(self, kwargs: dict, result: object, call_type: str) -> tuple[dict, object]:
        self._unrendered(call_type)  # a custom provider's route logs no pre-call: this comes after the call
        return kwargs, result

    def _unrendered(self, call_type: Any) -> None:
        """Warn once (:data:`SYNC_WARNING`) when LiteLLM reports a synchronous chat call, which no
        hook of this class rendered, unless :func:`completion` rendered it before the call."""
        if str(getattr(call_type, "value", call_type)) == SYNC_CALL and not _RENDERED.get() and not self.warned_sync:
            self.warned_sync = True
            warnings.warn(SYNC_WARNING, RuntimeWarning, stacklevel=2)

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict, call_type: Any) -> dict:
        return self.rendered(data, str(getattr(call_type, "value", call_type)))

    async def async_pre_call_deployment_hook(self, kwargs: dict, call_type: Any) -> dict | None:
        kind = getattr(call_type, "value", call_type)
        if kwargs.get("proxy_server_request") is not None:
            return None  # made by the LiteLLM proxy: async_pre_call_hook rendered it
        if getattr(kwargs.get("litellm_logging_obj"), "call_type", kind) != kind:
            return None  # LiteLLM carrying out another call, rendered as that one
        out = self.rendered(kwargs, str(kind))
        return None if out is kwargs else out

    def rendered(self, data: dict, call_type: str) -> dict:
        """``data`` (a LiteLLM request) with its history rendered; ``data`` itself when its call
        type or shape is not one the hook renders (see the class docstring)."""
        common: dict[str, Any] = {"budget": self.budget, "policy": self.policy, "store": self.store, "signals": self.signals}
        if call_type in CHAT_CALLS and isinstance(data.get("messages"), list):
            return {**data, "messages": render_messages(data["messages"], session=_session(data), **common)}
        if call_type in ANTHROPIC_CALLS and isinstance(data.get("messages"), list):
            out = {**data, "messages": render_anthropic_messages(data["messages"], system=data.get("system"),
                                                                 session=_session(data), **common)}
            if isinstance(data.get("metadata"), dict) and SESSION_KEY in data["metadata"]:
                out["metadata"] = {k: v for k, v in data["metadata"].items() if k != SESSION_KEY}
            return out
        if call_type in RESPONSES_CALLS and data.get("input") and passthrough_reason(data) is None:
            return {**data, "input": render_responses_input(data["input"], instructions=data.get("instructions"),
                                                            session=_session(data), **common)}
        return data


def _session(data: dict) -> str | None:
    """``historygraph_session`` from the request's ``metadata``, else from ``litellm_metadata`` (the
    proxy's own metadata on its ``/v1/messages`` and Responses routes)."""
    for key in ("metadata", "litellm_metadata"):
        meta = data.get(key)
        if isinstance(meta, dict) and meta.get(SESSION_KEY) is not None:
            return str(meta[SESSION_KEY])
    return None


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
