"""What a policy returns (:class:`Rendering`) and the errors of rendering: a budget too small for
the protected history (:class:`BudgetTooSmallError`) and a broken invariant (:class:`InvariantError`,
raised by :func:`~historygraph.render.invariants.check_invariants`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from historygraph.history.events import Message

class BudgetTooSmallError(ValueError):
    """The protected history alone exceeds the budget.

    Attributes:
        budget: the history budget B (tokens).
        required: tokens the protected history needs.
        shortfall: ``required − budget``.
        pins: the ids of the session's pinned items (tool call ids, ``"#n"`` message numbers), part
            of what every rendering shows whole (docs/architecture.md, "Pins"); ``()`` when none.
    """

    def __init__(self, budget: int, required: int, pins: Sequence[str] = ()) -> None:
        self.budget, self.required, self.shortfall = budget, required, required - budget
        self.pins = tuple(pins)
        pinned = (f"; the pinned items {', '.join(self.pins)} are shown whole and count in it (unpin one or raise "
                  f"the budget)" if self.pins else "")
        super().__init__(
            f"history budget {budget} tokens is {self.shortfall} tokens short: the protected history needs "
            f"{required} (what every rendering shows: the first user message and the latest assistant message, "
            f"and, where the history has them, the messages that open the active tool loop, their thinking "
            f"blocks, the agent's latest todo list or plan and the markers of steps left out; system and current user messages are outside B){pinned}; "
            f"use a budget of at least {required}")


class InvariantError(AssertionError):
    """A rendering broke one of the invariants of docs/architecture.md, invariant §5 (names which)."""


@dataclass
class Rendering:
    """What a policy returns for one invocation.

    Attributes:
        messages: the model input, chronological: system messages, history, current user message.
        positions: for each rendered message, its graph position (``None`` for a synthetic result).
        full: positions of tool results rendered with their complete stored text.
        omitted: positions of tool results not rendered complete (placeholder, excerpt or dropped).
        dropped: positions of messages left out entirely.
        history_tokens: tokens charged to B.
        input_tokens: tokens of the whole rendered message list (history + system + current user).
        reasons: per-position explanation of the decision.
        stats: policy-specific numbers (e.g. model calls for summarising policies).
    """

    policy: str
    budget: int | None
    messages: list[Message]
    positions: list[int | None]
    full: list[int]
    omitted: list[int]
    dropped: list[int]
    history_tokens: int
    input_tokens: int
    reasons: dict[int, str] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)

    def to_openai(self) -> list[dict[str, Any]]:
        return [m.to_openai() for m in self.messages]

    def defer_reasons(self, build: Callable[[], dict[int, str]]) -> None:
        """Let :attr:`reasons` be built by ``build()`` when first read (an explanation per stored
        message is O(history) strings; a model call reads none of them). ``build`` must depend only
        on what it captured, so the dict it returns is the one an eager build would have given."""
        self.__dict__["_reasons_build"] = build

    def defer_positions(self, omitted: np.ndarray, dropped: np.ndarray) -> None:
        """Let :attr:`omitted` and :attr:`dropped` be the lists of these int arrays (ascending
        positions, owned by the rendering: nothing else may change them), made when first read: at
        1,000 results they are ~3,000 Python ints per render, which a model call does not read."""
        d = self.__dict__
        d["_omitted_build"], d["_dropped_build"] = omitted.tolist, dropped.tolist

    def position_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """:attr:`omitted` and :attr:`dropped` as int64 arrays of ascending distinct positions,
        without making the lists when they are still put off (:meth:`defer_positions`, whose
        arrays are ascending already); read only."""
        d = self.__dict__
        return tuple(build.__self__ if (build := d.get(f"_{name}_build")) is not None  # type: ignore[return-value]
                     else np.unique(np.asarray(d[f"_{name}"], dtype=np.int64)) for name in ("omitted", "dropped"))

    def __getstate__(self) -> dict[str, Any]:
        for name in _DEFERRED:  # materialise: the builders are closures and bound methods
            getattr(self, name)
        return self.__dict__


_DEFERRED = ("reasons", "omitted", "dropped")


def _deferred(name: str, doc: str) -> property:
    """A property over the dataclass field ``name`` whose value may be put off (``_<name>_build``:
    a callable giving it, called once, when first read); ``Rendering(name=…)``, assignment and
    equality work as for a plain field."""
    key, build_key = f"_{name}", f"_{name}_build"

    def get(self: Rendering) -> Any:
        d = self.__dict__
        build = d.get(build_key)
        if build is not None:  # idempotent: two threads reading at once build equal values
            d[key] = value = build()
            d.pop(build_key, None)
            return value
        return d[key]

    def put(self: Rendering, value: Any) -> None:
        self.__dict__.pop(build_key, None)
        self.__dict__[key] = value

    return property(get, put, doc=doc)


Rendering.reasons = _deferred("reasons", "per-position explanation of the decision")  # type: ignore[assignment]
Rendering.omitted = _deferred("omitted", "positions of tool results not rendered complete")  # type: ignore[assignment]
Rendering.dropped = _deferred("dropped", "positions of messages left out entirely")  # type: ignore[assignment]


