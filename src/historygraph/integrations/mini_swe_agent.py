"""mini-swe-agent: a model wrapper that renders the agent's messages before every query.

>>> from minisweagent.agents.default import DefaultAgent                          # doctest: +SKIP
>>> agent = DefaultAgent(HistoryGraphModel(get_model(...), budget=6000), env, **agent_config)  # doctest: +SKIP

mini-swe-agent keeps the whole trajectory in ``agent.messages`` and passes it to
``model.query(messages)``; :class:`HistoryGraphModel` renders it (OpenAI chat form: tool-call mode
gives ``tool`` results; in text mode observations are ``user`` messages, which policies can only
drop, never replace by a placeholder) and queries the wrapped model with the result. Everything
else (``config``, ``format_message``, ``format_observation_messages``, ``get_template_vars``) is the
wrapped model's, so the agent's trajectory, costs and saved files are unchanged; ``serialize`` adds
the historygraph settings under ``info.config.historygraph``.
"""

from __future__ import annotations

from typing import Any

from historygraph.api import render_messages
from historygraph.policies import DEFAULT_POLICY, Policy, Signals
from historygraph.render import Rendering
from historygraph.store import Store


class HistoryGraphModel:
    """Wraps a mini-swe-agent model (anything with ``query(messages, **kwargs) -> dict``).

    Args:
        model: the wrapped model (``minisweagent.models.get_model(...)``, a test model, …).
        budget: history budget B in tokens (system and current user messages are outside B).
        policy: a registered policy name or an instance from :func:`historygraph.create`.
        session, store, signals: as :func:`historygraph.render_messages`.

    Attributes:
        last_rendering: the rendering of the latest query.

    Raises (from ``query``):
        EventError, PolicyError, BudgetTooSmallError: as :func:`historygraph.render_messages`.
    """

    def __init__(self, model: Any, budget: int, policy: str | Policy = DEFAULT_POLICY, *,
                 session: str | None = None, store: Store | None = None, signals: Signals | None = None) -> None:
        self.model, self.budget, self.policy = model, budget, policy
        self.session, self.store, self.signals = session, store, signals
        self.last_rendering: Rendering | None = None

    def query(self, messages: list[dict[str, Any]], **kwargs: Any) -> dict:
        history = [m for m in messages if m.get("role") != "exit"]
        r = render_messages(history, budget=self.budget, policy=self.policy, session=self.session,
                            store=self.store, signals=self.signals, explain=True)
        self.last_rendering = r.rendering
        return self.model.query(r.messages, **kwargs)

    def serialize(self) -> dict:
        data = self.model.serialize()
        name = self.policy if isinstance(self.policy, str) else getattr(self.policy, "name", type(self.policy).__name__)
        data.setdefault("info", {}).setdefault("config", {})["historygraph"] = {"budget": self.budget, "policy": name}
        return data

    def __getattr__(self, name: str) -> Any:  # config, format_message, get_template_vars, …
        return getattr(self.__dict__["model"], name)
