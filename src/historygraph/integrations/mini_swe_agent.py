"""mini-swe-agent: a model wrapper that renders the agent's messages before every query.

>>> from minisweagent.agents.default import DefaultAgent                          # doctest: +SKIP
>>> agent = DefaultAgent(HistoryGraphModel(get_model(...), budget=6000), env, **agent_config)  # doctest: +SKIP

Or chosen the way mini-swe-agent chooses any model class, by its import path, in the ``model``
section of a YAML config or on the command line (``mini --model-class
historygraph.integrations.mini_swe_agent.HistoryGraphModel -c mini.yaml -c model.history_budget=6000``):

.. code-block:: yaml

    model:
      model_class: historygraph.integrations.mini_swe_agent.HistoryGraphModel
      model_name: anthropic/claude-sonnet-4-5-20250929
      history_budget: 6000          # B, tokens (required)
      policy: contextrender         # optional, default learned
      store: runs.sqlite            # optional: a path, ":memory:" or postgresql://… (historygraph.open_store)
      wrapped_model_class: litellm  # optional: the model class wrapped, as mini-swe-agent's model_class
      model_kwargs: {temperature: 0}  # every other key is the wrapped model's

``minisweagent.models.get_model`` then calls ``HistoryGraphModel(**model_config)``, which builds
the wrapped model with ``get_model`` from the same section minus the historygraph keys
(``history_budget``, ``policy``, ``session``, ``store``, ``wrapped_model_class``).

mini-swe-agent keeps the whole trajectory in ``agent.messages`` and passes it to
``model.query(messages)``; :class:`HistoryGraphModel` renders it (OpenAI chat form: tool-call mode
gives ``tool`` results; in text mode observations are ``user`` messages, which policies can only
drop, never replace by a placeholder) and queries the wrapped model with the result. Everything
else (``config``, ``format_message``, ``format_observation_messages``, ``get_template_vars``) is the
wrapped model's, so the agent's trajectory, costs and saved files are unchanged; ``serialize`` adds
the historygraph settings under ``info.config.historygraph``.

Recall: mini-swe-agent gives the model one tool, bash; every action is a command the environment
runs. So the model recalls by a command, ``historygraph recall ID [ID ...]`` (a message span as
``A-B``: bash reads an unquoted ``#`` as a comment), and :class:`HistoryGraphEnvironment`, wrapped
around the agent's environment, answers it from the wrapped model's store instead of running it.
Answering in the environment wrapper, not with a real command in the sandbox, is what works where
mini-swe-agent usually runs commands (a Docker or Singularity container holding neither
historygraph nor the store, which may be in memory). Tell the model the command exists:
:data:`RECALL_HINT` is one sentence to add to the system template.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from typing import Any

from historygraph.api import default_store, render_messages
from historygraph.policies import DEFAULT_POLICY, Policy, Signals, check_production
from historygraph.render import Rendering
from historygraph.render.recall import MAX_TOKENS, recall_stored
from historygraph.store import Store, open_store

#: The command the model runs to recall, as its first two words.
RECALL_COMMAND = ("historygraph", "recall")
#: A sentence for the system template telling the model about the command.
RECALL_HINT = ("An output shown as '[tool result ID omitted from this context ...]' is stored in full: run "
               "`historygraph recall ID` to see it again (several ids at once; for '[omitted: messages #A–#B ...]' "
               "run `historygraph recall A-B`). Run it as a command of its own.")
RECALL_USAGE = "usage: historygraph recall ID [ID ...]: the ids the placeholders name, or a message span A-B (no '#')"
RECALL_ALONE = ("historygraph recall was not run: it must be a command of its own, without &&, ;, |, redirections or "
                "other lines (it is answered from the stored conversation, not by the shell). Run `historygraph recall "
                "ID ...` alone, then the rest as its own command.")


class HistoryGraphModel:
    """Wraps a mini-swe-agent model (anything with ``query(messages, **kwargs) -> dict``).

    Two ways to build it: with the model object (``HistoryGraphModel(model, budget)``), or, as
    ``minisweagent.models.get_model`` builds a model class named in a config, with keywords only:
    the historygraph keys below plus the wrapped model's own config (``model_name``,
    ``model_kwargs``, …), from which the wrapped model is built by ``get_model``.

    Args:
        model: the wrapped model (``minisweagent.models.get_model(...)``, a test model, …); leave
            it out to build it from ``model_config``.
        budget: history budget B in tokens (system and current user messages are outside B).
        policy: a registered policy name or an instance from :func:`historygraph.create`.
        session, signals: as :func:`historygraph.render_messages`.
        store: a :class:`~historygraph.store.Store`, or where one is
            (:func:`historygraph.open_store`: a SQLite path, ``":memory:"``, ``postgresql://…``).
        history_budget: B under its config name (the ``model`` section of a mini-swe-agent
            config, where a bare ``budget`` would read as a cost); give it or ``budget``.
        wrapped_model_class: the wrapped model's class, as mini-swe-agent's ``model_class`` (a
            short name such as ``litellm`` or an import path; empty: mini-swe-agent's default).
        model_config: the wrapped model's config (must hold ``model_name``).

    Attributes:
        last_rendering: the rendering of the latest query.
        last_session: the session id the latest query's messages were stored in (``None`` without
            a store).

    Raises:
        TypeError: both a model object and a config for one, or neither.
        ValueError: neither ``budget`` nor ``history_budget``, both, or not a positive integer.
        PolicyError: an unknown (or replay-only) policy name given with a config.
        EventError, PolicyError, BudgetTooSmallError: from ``query``, as :func:`historygraph.render_messages`.
    """

    def __init__(self, model: Any = None, budget: int | None = None, policy: str | Policy = DEFAULT_POLICY, *,
                 session: str | None = None, store: Store | str | None = None, signals: Signals | None = None,
                 history_budget: int | None = None, wrapped_model_class: str = "", **model_config: Any) -> None:
        if model is None:
            if "model_name" not in model_config:
                raise TypeError("HistoryGraphModel needs the model to wrap, or its mini-swe-agent config (model_name, …)")
            if isinstance(policy, str):
                check_production(policy)
            from minisweagent.models import get_model

            model = get_model(config={**model_config, "model_class": wrapped_model_class})
        elif model_config or wrapped_model_class:
            raise TypeError("HistoryGraphModel takes a model object or the config of one, not both; "
                            f"got a model and {', '.join(sorted(model_config)) or 'wrapped_model_class'}")
        if (budget is None) == (history_budget is None):
            raise ValueError("give the history budget B (tokens) once: budget=, or history_budget in a config"
                             + ("" if budget is None else f"; got budget={budget!r} and history_budget={history_budget!r}"))
        b = budget if budget is not None else history_budget
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"{'budget' if budget is not None else 'history_budget'} must be a positive integer (tokens), got {b!r}")
        self.model, self.budget, self.policy = model, b, policy
        self.session, self.signals = session, signals
        self.store = open_store(store) if isinstance(store, str) else store
        self.last_rendering: Rendering | None = None
        self.last_session: str | None = None

    def query(self, messages: list[dict[str, Any]], **kwargs: Any) -> dict:
        history = [m for m in messages if m.get("role") != "exit"]
        r = render_messages(history, budget=self.budget, policy=self.policy, session=self.session,
                            store=self.store, signals=self.signals, explain=True)
        self.last_rendering, self.last_session = r.rendering, r.session_id
        return self.model.query(r.messages, **kwargs)

    def serialize(self) -> dict:
        data = self.model.serialize()
        name = self.policy if isinstance(self.policy, str) else getattr(self.policy, "name", type(self.policy).__name__)
        data.setdefault("info", {}).setdefault("config", {})["historygraph"] = {"budget": self.budget, "policy": name}
        return data

    def __getattr__(self, name: str) -> Any:  # config, format_message, get_template_vars, …
        return getattr(self.__dict__["model"], name)


class HistoryGraphEnvironment:
    """Wraps a mini-swe-agent environment (anything with ``execute(action, ...) -> dict``) and
    answers the recall command itself.

    An action whose ``command`` is exactly ``historygraph recall`` followed by one or more ids
    (split as a POSIX shell would; no ``&&``, ``;``, ``|`` or redirection) is not run: its output
    is the complete stored results those ids name (each cut to ``max_tokens`` tokens, marked; an
    unknown id is said so; a recall chained with other commands, ``historygraph recall ID && ls``,
    is answered with :data:`RECALL_ALONE` and status 2, not sent to a shell that has no such
    program; a result stored as the wrapped model's ``observation_template`` rendered it is given
    back as the command's output alone, :func:`observation_unwrapper`, so that the agent's template
    wraps it once, not twice), read from ``model``'s store (the process's default in-memory store when
    it has only a ``session``) in its ``session``, else in the session of its latest query, with
    returncode 0. Every other action, and everything else (``get_template_vars``, ``serialize``,
    ``config``, …), is the wrapped environment's.

    Args:
        env: the wrapped environment (``LocalEnvironment``, ``DockerEnvironment``, …).
        model: the :class:`HistoryGraphModel` the agent queries.
        max_tokens: tokens of one recalled result shown at most.

    Raises:
        ValueError: ``model`` has neither ``session`` nor ``store`` (nothing is stored to recall).
    """

    def __init__(self, env: Any, model: HistoryGraphModel, max_tokens: int = MAX_TOKENS) -> None:
        if model.session is None and model.store is None:
            raise ValueError("the recall command needs a HistoryGraphModel with session= or store=: it reads the stored session")
        self.env, self.model, self.max_tokens = env, model, max_tokens
        self.unwrap = observation_unwrapper(getattr(getattr(model, "config", None), "observation_template", None))
        self.store = model.store if model.store is not None else default_store()  # where render_messages stores it

    def execute(self, action: dict, *args: Any, **kwargs: Any) -> dict[str, Any]:
        command = str(action.get("command", ""))
        ids = recall_ids(command)
        if ids is None and starts_with_recall(command):  # chained with other commands: the shell has no such program
            return {"output": RECALL_ALONE + "\n", "returncode": 2, "exception_info": ""}
        if ids is None:
            return self.env.execute(action, *args, **kwargs)
        if not ids:
            return {"output": RECALL_USAGE + "\n", "returncode": 2, "exception_info": ""}
        counter = self.model.signals.counter if self.model.signals else None
        text = recall_stored(self.store, self.model.session or self.model.last_session, ids, counter, self.max_tokens,
                             self.unwrap)
        return {"output": text if text.endswith("\n") else text + "\n", "returncode": 0, "exception_info": ""}

    def __getattr__(self, name: str) -> Any:  # config, get_template_vars, serialize, …
        return getattr(self.__dict__["env"], name)


#: What :func:`observation_unwrapper` renders the template with, to find where the output goes.
_PROBE_OUTPUT, _PROBE_CODE = "HISTORYGRAPH_PROBE_OUTPUT", 918273645


def observation_unwrapper(template: str | None) -> Callable[[str], str] | None:
    """A function that takes mini-swe-agent's observation wrapping off a stored tool result: the
    command's output as the agent's ``observation_template`` (Jinja2, rendered with ``output`` =
    ``{"output", "returncode", "exception_info"}``) put it in, decoded where the template wrote it
    with ``tojson`` (mini.yaml's JSON form); a text the template's short form does not produce (a
    long output's head and tail, an exception, another framework's text) is returned unchanged.
    ``None`` when there is no template or it does not render with ``output`` alone.

    The shape is learned from the template itself, rendered once with a probe output and return
    code, so the shipped templates (XML tags, JSON) and a user's own are handled alike."""
    if not template:
        return None
    try:
        from jinja2 import StrictUndefined, Template, TemplateError
    except ImportError:  # mini-swe-agent depends on Jinja2; without it there is no template to undo
        return None
    try:
        probe = Template(template, undefined=StrictUndefined).render(
            output={"output": _PROBE_OUTPUT, "returncode": _PROBE_CODE, "exception_info": ""})
    except (TemplateError, TypeError, ValueError):
        return None
    quoted = json.dumps(_PROBE_OUTPUT)
    as_json = quoted in probe
    head, sep, tail = probe.partition(quoted if as_json else _PROBE_OUTPUT)
    if not sep or not (head or tail):
        return None  # the output alone, or not in the template at all: nothing to take off
    code = re.escape(str(_PROBE_CODE))
    value = r'("(?:[^"\\]|\\.)*")' if as_json else "(.*)"
    pattern = re.compile(re.escape(head).replace(code, "-?[0-9]+") + value + re.escape(tail).replace(code, "-?[0-9]+"),
                         re.DOTALL)

    def unwrap(text: str) -> str:
        m = pattern.fullmatch(text)
        if m is None:
            return text
        if not as_json:
            return m.group(1)
        try:
            inner = json.loads(m.group(1))
        except json.JSONDecodeError:
            return text
        return inner if isinstance(inner, str) else text

    return unwrap


def starts_with_recall(command: str) -> bool:
    """Whether ``command``'s first two words are ``historygraph recall`` (whatever follows)."""
    return tuple(command.split()[:2]) == RECALL_COMMAND


def recall_ids(command: str) -> list[str] | None:
    """The ids of a recall command (``historygraph recall ID [ID ...]``, split as POSIX sh does,
    ``#`` starting a comment; ``[]`` when it names none); ``None`` for any other command, one of
    several lines, one with a shell operator or redirection, or one that does not parse."""
    if "\n" in command.strip():
        return None
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # an unclosed quote
        return None
    if tuple(words[:2]) != RECALL_COMMAND:
        return None
    if any(w and all(c in lexer.punctuation_chars for c in w) for w in words[2:]):
        return None
    return words[2:]
