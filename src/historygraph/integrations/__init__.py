"""Adapters for agent frameworks. Each module imports its framework, which is an optional extra
(from a clone: ``pip install -e ".[langchain]"``, ``[openai-agents]``, ``[litellm]``, ``[mini-swe-agent]``);
``import historygraph`` never imports them.

* :mod:`.langchain`: ``HistoryGraphMiddleware`` for LangChain v1 ``create_agent`` (``wrap_model_call``);
* :mod:`.openai_agents`: ``HistoryGraphInputFilter`` for the OpenAI Agents SDK's
  ``RunConfig(call_model_input_filter=...)``;
* :mod:`.litellm`: ``completion``/``acompletion`` wrappers and a ``CustomLogger`` pre-call hook for the LiteLLM proxy;
* :mod:`.mini_swe_agent`: ``HistoryGraphModel``, a mini-swe-agent model wrapper.

All of them render through :func:`historygraph.api.render_events`, so a policy given by name renders
cache-stable, with or without a store (:mod:`historygraph.policies.cache_stable`: between
re-selections each call's history starts with the previous call's), and each has a recall tool in its
framework's form that fetches an omitted result by the id its placeholder names
(:mod:`historygraph.render.recall`); see docs/library.md.
"""
