"""Library adapter for an agent loop that does not go through the proxy (ContextRender Appendix D,
"methods that construct the conversation history").

>>> s = Session(budget=2000, policy="prune")
>>> s.add({"role": "user", "content": "hi"})
0
>>> s.render()
[{'role': 'user', 'content': 'hi'}]

Each :meth:`Session.add` appends one event to the session's append-only graph in a store (an
in-memory store unless one is given); :meth:`Session.render` renders the whole graph with a
registered policy under a history budget (tokens), checks the invariants of docs/architecture.md, invariant §5 and
returns OpenAI chat messages. The policy is wrapped for cache-stable rendering by default
(:mod:`historygraph.policies.cache_stable`: between re-selections a rendering only appends, or
rewrites only its young part, so a provider's prompt cache serves the previous request; ``cache_stable=False`` re-selects at every
call). The last :class:`~historygraph.render.Rendering` (selected and omitted ids, tokens,
reasons) is kept in :attr:`Session.rendering`; what every render left out and why is kept in the
store as the session's omission stream (:meth:`Session.omitted`).
"""

from __future__ import annotations

from typing import Any

from historygraph import telemetry
from historygraph.history.events import Message
from historygraph.policies import DEFAULT_POLICY, Signals, create
from historygraph.policies.cache_stable import cache_stable
from historygraph.render import Rendering, check_invariants
from historygraph.render.omissions import omission_record
from historygraph.store import MemoryStore, Store, StoreError


class Session:
    """One agent run's history.

    Args:
        session_id: the session in ``store`` (created when missing, reopened otherwise).
        store: where events are kept; default a fresh :class:`~historygraph.store.MemoryStore`.
        policy, budget: defaults for :meth:`render` (a registered policy name; tokens).
        cache_stable: wrap every policy but ``full`` for cache-stable rendering (module docstring).
        signals: shared signal providers; default one with the store's caches.

    Raises:
        PolicyError: unknown policy name (when rendering).
        EventError/GraphError: an invalid event (nothing is stored).
    """

    def __init__(self, session_id: str = "session", store: Store | None = None, policy: str = DEFAULT_POLICY,
                 budget: int = 6000, signals: Signals | None = None, cache_stable: bool = True) -> None:
        self.session_id = session_id
        self.store = store if store is not None else MemoryStore()
        _check_budget(budget)
        if not self.store.has_session(session_id):
            try:
                self.store.create_session(session_id)
            except StoreError:  # created a moment ago by another process sharing the store
                pass
        self.policy, self.budget = policy, budget
        self.signals = signals or Signals(store=self.store)
        self.rendering: Rendering | None = None
        self._policies: dict[str, Any] = {}
        self.cache_stable = cache_stable

    def add(self, message: Message | dict[str, Any], *, pin: bool = False, idempotency_key: str | None = None,
            expected_length: int | None = None) -> int:
        """Append one event (a :class:`Message` or an OpenAI chat message dict); returns its position.
        ``pin``: pin it as well (:meth:`pin`).

        ``idempotency_key`` and ``expected_length`` are those of :meth:`Store.append`
        (:mod:`historygraph.store.base`): an ``add`` that raised a connection error after the store
        committed can be called again with the same key and message and returns the first
        position, storing nothing new; with ``expected_length`` the event lands at exactly that
        position or not at all.

        Raises:
            historygraph.store.AppendConflict: the key was used for another message, or the
                session does not hold ``expected_length`` events (nothing is stored).
        """
        m = message if isinstance(message, Message) else Message.from_openai(message)
        position = self.store.append(self.session_id, m, idempotency_key=idempotency_key, expected_length=expected_length)[0]
        if pin:
            self.store.pin(self.session_id, position)
        return position

    def pin(self, item: int | str) -> int:
        """Pin an item so that every rendering shows it whole, whatever the policy (docs/library.md,
        "Pins"): ``item`` is a position (what :meth:`add` returned), a message number (``"#3"``) or a
        tool call id (its result). Kept in the store: a reopened session has its pins. A budget
        that cannot hold the pinned items with the rest of the protected history makes
        :meth:`render` raise :class:`~historygraph.render.BudgetTooSmallError` naming them.
        Returns the position; pinning twice changes nothing.

        Raises:
            KeyError: the session holds no such item (nothing is stored).
        """
        return self.store.pin(self.session_id, item)

    def unpin(self, item: int | str) -> int:
        """Undo :meth:`pin` (nothing when ``item`` is not pinned); returns the position.
        Raises KeyError as :meth:`pin`."""
        return self.store.pin(self.session_id, item, pinned=False)

    @property
    def pins(self) -> list[str]:
        """The pinned items, oldest first: a tool result by its call id, a message by its number (``"#3"``)."""
        graph = self.store.graph(self.session_id)
        return [graph.item_id(p) for p in self.store.pins(self.session_id)]

    def render(self, budget: int | None = None, policy: str | None = None) -> list[dict[str, Any]]:
        """The model input for the next call: OpenAI chat messages, history within ``budget`` tokens
        (``None``: the session's default). Raises ValueError for a budget that is not a whole number
        of tokens ≥ 1 (``"6k"``, ``6000.0``, ``0``) and :class:`~historygraph.render.BudgetTooSmallError`
        when it cannot hold the protected history."""
        if budget is not None:
            _check_budget(budget)
        name = policy or self.policy
        if name not in self._policies:
            self._policies[name] = cache_stable(create(name)) if self.cache_stable else create(name)
        graph = self.store.graph(self.session_id)
        budget = self.budget if budget is None else budget
        with telemetry.render_span(self.session_id, budget) as span:
            self.rendering = self._policies[name].render(graph, budget, self.signals)
            check_invariants(self.rendering, graph, self.signals.counter)
            telemetry.rendered(span, self.rendering, len(graph))
        self.store.record_omitted(self.session_id, omission_record(self.rendering, len(graph)))
        return self.rendering.to_openai()

    def omitted(self) -> list[dict[str, Any]]:
        """What each :meth:`render` of this session left out and why, oldest first: the records of
        :mod:`historygraph.render.omissions` (:meth:`Store.omitted`; expand one into rows with ids
        and tokens with :func:`historygraph.render.omissions.expand`)."""
        return self.store.omitted(self.session_id)

    def result(self, tool_call_id: str) -> str:
        """The complete stored text of a tool result, e.g. one a rendering omitted (KeyError if unknown)."""
        return self.store.graph(self.session_id).result_by_id(tool_call_id).content

    def recall(self, ref: str) -> str:
        """What a rendering left out, by the reference its stand-in names: a tool call id (named by
        a placeholder ``[tool result ID omitted ...]``) gives that result's complete stored text, as
        :meth:`result`; a message number or span (``"#16"``, ``"#16–#23"``, named by a dropped-step
        marker) gives those stored messages in full, each headed by its number and role
        (:meth:`~historygraph.history.graph.ContextGraph.recall_text`). Raises KeyError naming
        ``ref`` when it is neither. A model calls it through the recall tool
        (:mod:`historygraph.render.recall`, docs/library.md)."""
        return self.store.graph(self.session_id).recall_text(ref)


def _check_budget(budget: object) -> None:
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        hint = " (write 6000, not '6k')" if isinstance(budget, str) else ""
        raise ValueError(f"budget must be a whole number of tokens >= 1, got {budget!r}{hint}")
