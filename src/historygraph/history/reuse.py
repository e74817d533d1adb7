"""Tool-Flow Analysis (TFA): observed reuse of values from earlier tool results.

Specification: ContextRender §3.2 and Appendix A.2.

* Extraction: candidates match ``[A-Za-z0-9][A-Za-z0-9_.\\-]{4,}``; every other character
  (quotes, brackets, commas, colons, slashes, whitespace, ``@`` …) separates candidates, so a
  path is tested segment by segment and an e-mail address splits at ``@``.
* Stripping: leading and trailing ``.``, ``-`` and ``_`` are removed; inner ones are kept.
* Filters: at least 6 characters after stripping; must contain an underscore, an uppercase
  letter, a digit, a hyphen or a period; pure-alphabetic Titlecase words are excluded.
* Matching: exact, case-sensitive, whole-token. A later *operation* (a model output's text, or
  one tool call's name and arguments) uses a value when the same extraction applied to the
  operation yields that exact value.
* Attribution: each use goes to the first earlier tool result containing the value.
* Counting: a distinct value counts once per operation; separate operations count separately.
* Weighting (eq. 1): ``c_t(r) = Σ_{m ∈ M_t(r)} 1 / n_t(m)`` where ``n_t(m)`` is the number of
  tool results before invocation ``t`` that contain the value (results, not occurrences).
"""

from __future__ import annotations

import operator
import re
from collections import defaultdict
from functools import partial
from dataclasses import dataclass
from typing import Iterable

CANDIDATE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{4,}")
MIN_LENGTH = 6
_QUALIFYING = re.compile(r"[_A-Z0-9.\-]")
_TITLECASE = re.compile(r"[A-Z][a-z]+")


def extract_values(text: str) -> set[str]:
    """The set of qualifying TFA values in ``text`` (ContextRender A.2)."""
    out: set[str] = set()
    for raw in CANDIDATE.findall(text):
        value = raw.strip("._-")
        if len(value) < MIN_LENGTH or not _QUALIFYING.search(value) or _TITLECASE.fullmatch(value):
            continue
        out.add(value)
    return out


@dataclass(frozen=True, slots=True)
class ReuseMatch:
    """One observed reuse: ``value`` from result at ``source`` used by the operation ``op`` of the
    message at ``user`` (op 0 is the message text, op k ≥ 1 its k-th tool call)."""

    source: int
    user: int
    op: int
    value: str


_ONE_OVER = partial(operator.truediv, 1.0)  # n -> 1.0 / n


class ReuseIndex:
    """Incremental TFA state for one session, fed messages in chronological order.

    ``add_result`` registers a tool result's values; ``add_operations`` records the matches of a
    model output. Both take values already extracted (:func:`extract_values`), so that a caller can
    keep them (the graph stores them with the session, :data:`historygraph.history.graph.TFA_VALUES`). ``score(position)`` returns ``c_t(r)`` for the current state, i.e. with
    ``n_t`` counted over all results added so far (the graph state before invocation ``t``).
    """

    def __init__(self) -> None:
        self._holders: dict[str, list[int]] = defaultdict(list)  # value -> result positions, in order
        self.matches: dict[int, list[ReuseMatch]] = defaultdict(list)  # source result -> matches
        # source result -> the holder list (of ``_holders``) of each match's value, in match order:
        # what score() sums over, without reading each match's value again
        self._match_holders: dict[int, list[list[int]]] = defaultdict(list)
        # score(p) as last computed; dropped when a match of p is added or a value p was matched on
        # gains a holder (every match of a value goes to its first holder, which never changes)
        self._scores: dict[int, float] = {}
        self._matched: set[str] = set()
        self._version = 0  # bumped by every change, so a score computed across one is not kept
        self.values: dict[int, frozenset[str]] = {}  # result position -> its values
        #: results whose matches or score changed, in the order of the changes (appended to only, so
        #: that a reader keeping per-result state reads what changed since its last read)
        self.touched: list[int] = []

    def add_result(self, position: int, values: Iterable[str]) -> None:
        """Register the values of the tool result at ``position`` (:func:`extract_values` of its text;
        kept in :attr:`values`)."""
        values = self.values[position] = frozenset(values)
        for value in values:
            holders = self._holders[value]
            holders.append(position)
            if value in self._matched:
                self._version += 1
                self._scores.pop(holders[0], None)
                self.touched.append(holders[0])

    def add_operations(self, position: int, operations: Iterable[Iterable[str]]) -> list[ReuseMatch]:
        """Record the uses in one assistant message; each entry of ``operations`` holds the values
        (:func:`extract_values`) of one operation, taken in sorted order."""
        found: list[ReuseMatch] = []
        for op, values in enumerate(operations):
            for value in sorted(values):
                holders = self._holders.get(value)
                if holders:
                    m = ReuseMatch(source=holders[0], user=position, op=op, value=value)
                    self.matches[holders[0]].append(m)
                    self._match_holders[holders[0]].append(holders)
                    self._matched.add(value)
                    self._version += 1
                    self._scores.pop(holders[0], None)
                    self.touched.append(holders[0])
                    found.append(m)
        return found

    def seed(self, scores: Iterable[tuple[int, float]], since: int) -> None:
        """Take ``(position, c_t)`` pairs computed when :attr:`touched` had ``since`` entries (a
        stored snapshot, :data:`historygraph.history.graph.TFA_SCORES`): each is kept as :meth:`score`'s
        value unless its result was touched since (a match of it added, or a value it was matched
        on gaining a holder: what changes a term of its sum)."""
        changed = set(self.touched[since:])
        for p, c in scores:
            if p not in changed:
                self._scores.setdefault(p, c)

    def first_holder(self, value: str) -> int | None:
        """The position of the first result that holds ``value`` (where TFA attributes its uses), or ``None``."""
        holders = self._holders.get(value)
        return holders[0] if holders else None

    def holders(self, value: str) -> int:
        """``n_t(m)``: how many results so far contain ``value``."""
        return len(self._holders.get(value, ()))

    def score(self, position: int) -> float:
        """``c_t(r)`` of the result at ``position`` (eq. 1); kept until one of its terms changes."""
        c = self._scores.get(position)
        if c is None:
            version = self._version
            # Σ 1 / n_t(m) in match order (the sum of the per-match generator it replaced, bit for bit)
            c = sum(map(_ONE_OVER, map(len, self._match_holders.get(position, ()))))
            if version == self._version:
                self._scores[position] = c
        return c
