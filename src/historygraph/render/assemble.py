"""The rendering built from a layout and a selection, part of
:class:`~historygraph.render.layout.Layout` (:class:`Assembly`, one of its bases): the render order
walked once, each result shown as selected or as its placeholder, synthetic answers after their
calls, a policy's inserts after the step they follow, dropped steps left out with one marker per
run (docs/architecture.md, invariants §5.2, §5.6, §5.7), and the reasons of every decision, built
when first read."""

from __future__ import annotations

import bisect
from typing import Any, Callable

import numpy as np

from historygraph.history.events import Message
from historygraph.render._units import Runs
from historygraph.render.pricing import StepPricing
from historygraph.render.rendering import Rendering
from historygraph.render.selection import Selection


def _not_shown(tools: np.ndarray, full) -> np.ndarray:  # noqa: ANN001 - a list or an int64 array
    """The result positions of ``tools`` (ascending) that are not in ``full`` (a subset of them, in
    any order): the rendering's omitted results, a new array."""
    if not len(full):
        return tools.copy()
    keep = np.ones(len(tools), dtype=bool)
    keep[np.searchsorted(tools, full)] = False
    return tools[keep]


class Assembly(StepPricing):
    """The assembly methods of a layout, over the layout's state (set by
    :class:`~historygraph.render.layout.Layout`; what these methods read is declared here)."""

    order: list[int]
    outside: set[int]
    synthetic: dict[int, list[Message]]
    placeholder: dict[int, Message]
    loop_guard: tuple[int, ...]
    full_history_tokens: int
    _arr: dict[str, np.ndarray]
    _tokens: list[int]
    _starts: list[int]
    _lo: list[int]
    _tools: np.ndarray
    _tools_ph: np.ndarray
    _reasons: dict[int, str]
    _pending: list[Callable[[dict[int, str]], None]]

    def _assemble_whole(self, policy: str, selection: Selection) -> Rendering:
        """:meth:`assemble` with every result shown complete, when nothing is dropped or left out,
        nothing inserted and every candidate's form is its stored message: the rendering is the
        render order itself (with the synthetic answers after their calls), built by slices from
        the skeleton, not message by message. Its history tokens are the skeleton's complete
        tokens (every unit complete, synthetic answers included), and nothing else is charged.
        ``selection``: an empty one, for the reasons."""
        msgs, order, synthetic = self.graph.messages, self.order, self.synthetic
        get = msgs.__getitem__
        if synthetic:  # the synthetic answers of a unit's message follow it, before its results
            out: list[Message] = []
            positions: list[int | None] = []
            prev = 0
            starts = self._starts
            # (a synthetic answer follows an assistant message: a unit's first message)
            for at, p in sorted((starts[bisect.bisect_left(self._lo, p)] + 1, p) for p in synthetic):
                out += map(get, order[prev:at])
                positions += order[prev:at]
                out += synthetic[p]
                positions += [None] * len(synthetic[p])
                prev = at
            out += map(get, order[prev:])
            positions += order[prev:]
        else:
            out, positions = list(map(get, order)), list(order)
        order_arr, tools = self._arr["order"], self._tools
        is_tool = np.zeros(len(msgs), dtype=bool)
        is_tool[tools] = True
        full_arr = order_arr[is_tool[order_arr]]  # in render order, as assemble appends them
        dropped = np.zeros(0, dtype=np.int64)
        if self.graph.superseded:
            dropped = np.union1d(dropped, np.fromiter(self.graph.superseded, dtype=np.int64))
        history = self.full_history_tokens
        tokens = self._tokens
        total = history + sum(tokens[p] for p in self.outside)
        rendering = Rendering(policy=policy, budget=self.budget, messages=out, positions=positions,
                              full=full_arr.tolist(), omitted=[], dropped=[], history_tokens=history,
                              input_tokens=total)
        rendering.defer_positions(_not_shown(tools, full_arr), dropped)
        rendering.defer_reasons(self._reasons_builder(selection, {}, [], []))
        return rendering

    def assemble(self, policy: str, selection: Selection) -> Rendering:
        """Build the rendering: results in ``selection.shown`` are rendered with the given message
        (the original for full, or an excerpt), other results of retained steps as placeholders,
        dropped steps that were not revived are left out. Chronological."""
        # (over 80 lines: one walk over the render order with its state in locals, run once per
        # rendered message; a helper per message would cost a call each)
        shown = selection.shown
        msgs = self.graph.messages
        dropped_at, dropped = self._left_out_entries(selection)
        briefs = {self.units[u].positions[0]: b for u in selection.revived if u in self.dropped_units
                  if u not in selection.recent if (b := self.brief(u)[1]) is not None}
        for u, b in selection.recent_briefs.items():  # the newest steps' short brief views (Selection.revive_recent)
            if u in selection.revived:
                briefs[self.units[u].positions[0]] = b
        stubs = selection.stubs
        marks: list[tuple[int, str]] = []  # (result, reason) of placeholders and excerpts, in render order
        placeholders: list[int] = []  # the results rendered as their placeholder
        out: list[Message] = []
        positions: list[int | None] = []
        full: list[int] = []
        history = outside = 0  # tokens charged to B, tokens of system and current user messages
        pending: list[Message] = []  # inserts wait for the end of the step they follow
        count, tokens, placeholder = self.counter.count_message, self._tokens, self.placeholder
        runs = selection.runs
        order, starts, units, lo = self.order, self._starts, self.units, self._lo
        n_lo, bisect_left = len(lo), bisect.bisect_left
        joined: list[int] = []  # text replies left out with the dropped steps after them (see _close_run)
        last_marker: list[int] = []  # index in ``out`` and first unit of the latest marker
        # without inserts, the entries of a run of marked units are those units' positions, one after
        # the other (no message outside B between them), all left out: the walk steps over them
        jump = not self.inserts
        open_run: int | None = None
        k, n_order = 0, len(order)
        while k < n_order:
            p = order[k]
            m = msgs[p]
            if m.role != "tool":
                if pending:
                    history += self._flush(pending, out, positions)
                i = bisect_left(lo, p)  # (what unit_at says, inline: once per message walked)
                a = runs.run_of(i) if i < n_lo and lo[i] == p else None
                if open_run is not None and a != open_run:
                    history += self._close_run(open_run, runs, out, positions, joined, last_marker)
                    open_run = None
                if a is not None:
                    open_run = a
                    if jump:
                        last_unit = runs.end[open_run]
                        k = starts[last_unit] + len(units[last_unit].positions)
                        continue
            if not dropped_at[k]:
                if m.role == "tool":
                    ph = placeholder.get(p, m)
                    r = shown.get(p)
                    if r is None:
                        r = stubs.get(p, ph) if stubs else ph
                    if r is m:
                        full.append(p)
                        n = tokens[p]
                    else:
                        marks.append((p, "omitted: placeholder" if r.rendered_as == "placeholder" else "excerpt"))
                        if r is ph:  # (counted after the walk, from the memo's arrays)
                            placeholders.append(p)
                            n = 0
                        else:
                            n = count(r)
                else:
                    r = briefs.get(p, m)
                    n = tokens[p] if r is m else count(r)
                out.append(r)
                positions.append(p)
                if p in self.outside:
                    outside += n
                else:
                    history += n
                for s in self.synthetic.get(p, ()):
                    out.append(s)
                    positions.append(None)
                    history += count(s)
            if p in self.inserts:
                pending.append(self.inserts[p])
            k += 1
        history += self._flush(pending, out, positions)
        if open_run is not None:
            history += self._close_run(open_run, runs, out, positions, joined, last_marker)
        if placeholders:
            history += int(self._tools_ph[self._tools.searchsorted(placeholders)].sum())
        if joined:
            dropped = np.union1d(dropped, np.asarray(joined, dtype=np.int64))
        rendering = Rendering(policy=policy, budget=self.budget, messages=out, positions=positions, full=full,
                              omitted=[], dropped=[], history_tokens=history, input_tokens=history + outside)
        # (every result shown in full is one of the graph's results)
        rendering.defer_positions(_not_shown(self._tools, full), dropped)
        rendering.defer_reasons(self._reasons_builder(selection, briefs, marks, joined))
        return rendering

    def _left_out_entries(self, selection: Selection) -> tuple[Any, np.ndarray]:
        """Per render-order entry whether it is left out (its unit is dropped and not revived: a
        bool array, or a list of them when the walk looks at every entry, with inserts), and the
        positions left out, ascending, superseded results included."""
        n_units = len(self._dropped_mask)
        idle = np.empty(n_units + 1, dtype=bool)  # one more, False: entries outside B have unit −1 (kept)
        idle[:n_units] = self._dropped_mask
        idle[n_units] = False
        if selection.revived:
            idle[list(selection.revived)] = False
        at = idle[self._arr["entry_unit"]]
        dropped_at = at.tolist() if self.inserts else at  # (the walk steps over runs: few look-ups)
        dropped = self._arr["order"][at]
        if self.graph.superseded:
            dropped = np.union1d(dropped, np.fromiter(self.graph.superseded, dtype=np.int64))
        return dropped_at, dropped

    def _flush(self, pending: list[Message], out: list[Message], positions: list[int | None]) -> int:
        """Append the inserts waiting in ``pending`` (emptied); the tokens they add."""
        added = 0
        count = self.counter.count_message
        for s in pending:
            out.append(s)
            positions.append(None)
            added += count(s)
        pending.clear()
        return added

    def _close_run(self, a: int, runs: Runs, out: list[Message], positions: list[int | None],
                   joined: list[int], last_marker: list[int]) -> int:
        """Append the marker of the run of units ``a..runs.end[a]``; the tokens it adds (less what
        it takes out). In the active tool loop (after its opening thinking block) a marker right
        after an assistant message without tool calls would be a wire user turn holding no tool
        result, and the provider's loop would begin after it, at an assistant message without the
        thinking block (docs/architecture.md, invariant §5.7). Such a reply (a late result is
        rendered before it, at its call) is left out with the run (added to ``joined``), and a
        marker right before it (``last_marker``: its index in ``out`` and first unit) is merged."""
        msgs, lo = self.graph.messages, self._lo
        opening = self.loop_guard[-1] if self.loop_guard else None
        added = 0
        b = runs.end[a]
        q = positions[-1] if positions else None
        if opening is not None and q is not None and q > opening and msgs[q].role == "assistant" \
                and not msgs[q].tool_calls and (i := bisect.bisect_left(lo, q)) < len(lo) and lo[i] == q and i == a - 1:
            r = out.pop()
            positions.pop()
            added -= self._tokens[q] if r is msgs[q] else self.counter.count_message(r)
            joined.append(q)
            a -= 1
            if last_marker and last_marker[0] == len(out) - 1 and runs.end.get(last_marker[1]) == a - 1:
                out.pop()
                positions.pop()
                added -= self._marker_tokens(last_marker[1], a - 1)
                a = last_marker[1]
        out.append(self.marker(a, b))
        positions.append(None)
        added += self._marker_tokens(a, b)
        last_marker[:] = [len(out) - 1, a]
        return added

    def _reasons_builder(self, selection: Selection, briefs: dict[int, Message],
                         marks: list[tuple[int, str]], joined: list[int]) -> Callable[[], dict[int, str]]:
        """The rendering's reasons, built when first read, from what this call captures now
        (copies of what may still change: the policy's reasons, the revived units, the
        superseded results)."""
        base, pending = dict(self._reasons), list(self._pending)
        revived, superseded = set(selection.revived), dict(self.graph.superseded)
        recent = set(selection.recent)
        msgs, units, dropped_units, left_out, outside = self.graph.messages, self.units, self.dropped_units, \
            self.left_out, self.outside

        def build() -> dict[int, str]:
            reasons = dict(base)
            for fill in pending:
                fill(reasons)
            for p, later in superseded.items():
                reasons[p] = f"superseded: a later result for the same call (message {later}) is rendered instead"
            why = "retained non-tool history over its share of the budget, oldest first"
            for u in dropped_units - left_out:  # dropped for the share; a policy's own omissions keep its reason
                for p in units[u].positions:
                    if u in revived:
                        if msgs[p].role != "tool":
                            because = ("it is one of the newest assistant messages, so the agent sees what it just did"
                                       if u in recent else "a result of its step is shown")
                            reasons.setdefault(p, f"kept{' in brief (its text left out)' if p in briefs else ''}: brought "
                                                  f"back because {because}; the layout had dropped its step first, as {why}")
                    elif p not in reasons:
                        reasons[p] = f"dropped: {why}"
                    elif msgs[p].role == "tool":  # the policy's own choice for it did not take effect
                        reasons[p] = f"dropped with its step: {why}; the policy had decided: {reasons[p]}"
            for p in outside:
                reasons.setdefault(p, "outside B: " + ("system message" if msgs[p].role == "system" else
                                                            "current user message (the latest, which the steps after it answer)"))
            for p, why_p in marks:
                reasons.setdefault(p, why_p)
            for p in joined:
                reasons[p] = ("left out with the dropped steps after it: their marker must not follow a text reply "
                              "inside the active tool loop (docs/architecture.md, invariant §5.7)")
            return reasons
        # the selection lives as long as the rendering's reasons may still be built: the reasons a
        # policy deferred may reach it through a weak reference (contextrender), so that the layout's
        # pending reasons do not hold it (selection -> layout -> pending -> selection: a cycle)
        build.selection = selection  # type: ignore[attr-defined]
        return build
