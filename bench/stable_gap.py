"""Where ``learned-stable`` loses recall against ``learned`` (issue 48, item 6).

Replays each trajectory through ``learned`` and ``learned-stable`` at one budget B (tokens), as
``historygraph replay`` does (the same B.4 reuse events, a result counts when it is shown complete),
and classifies every reuse event that ``learned`` hits and ``learned-stable`` misses:

* ``reselected now``: the call is a re-selection, rendered at ``low_mark·B``, which left the result
  out (``learned`` at B shows it at the same call);
* ``earlier re-selection, p < predicted_tail``: the result was in the history at the last
  re-selection, which left it out, and no copy was appended since because its reuse probability
  (``learned``'s, at this call) is under the ``predicted_tail`` threshold and the latest call did not
  use its values (``recall_tail``); split by whether ``learned`` at B showed it at that re-selection;
* ``earlier re-selection, no room``: as above with a probability at or over the threshold, but its
  copy does not fit under B;
* ``arrived since, not complete``: arrived after the last re-selection yet not shown complete;
* ``budget error``: ``learned-stable`` raised ``BudgetTooSmallError`` at the call.

For the no-room class it also sums the tokens of the missed results, of the history then, and of
the results appended since the re-selection that no later event reuses (what evicting them could free).

Usage: ``PYTHONPATH=src python bench/stable_gap.py TRACES B [name=value ...]`` (the values are
``learned-stable`` parameters, e.g. ``low_mark=0.8``). Prints JSON.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

from historygraph.eval.recall import reuse_events
from historygraph.history.graph import ContextGraph
from historygraph.policies import Signals
from historygraph.policies.registry import create
from historygraph.render import BudgetTooSmallError, Rendering
from historygraph.signals.tokens import TokenCounter
from historygraph.store import open_store
from historygraph.traces import read_traces


def _value(text: str) -> float | bool:
    return text == "true" if text in ("true", "false") else float(text)


def _full(policy, graph: ContextGraph, budget: int, signals: Signals) -> tuple[set[int], Rendering | None]:  # noqa: ANN001
    try:
        r = policy.render(graph, budget, signals)
    except BudgetTooSmallError:
        return set(), None
    return set(r.full), r


def main() -> None:
    path, budget = sys.argv[1], int(sys.argv[2])
    params = {k: _value(v) for k, v in (a.split("=", 1) for a in sys.argv[3:])}
    signals = Signals(counter=TokenCounter(), store=open_store(":memory:"))
    count = signals.counter.count_message
    classes: Counter[str] = Counter()
    totals: Counter[str] = Counter()
    for trace in read_traces(path):
        learned = create("learned", replay=True)
        stable = create("learned-stable", replay=True, **params)
        cfg = stable.config  # type: ignore[attr-defined]
        msgs = trace.messages
        events = reuse_events(msgs)
        at: dict[int, list] = {}
        for e in events:
            at.setdefault(e.turn, []).append(e)
        graph = ContextGraph(trace.trace_id)
        reselected_at = 0  # graph length at the last re-selection
        learned_at: dict[int, set[int]] = {}  # graph length -> results learned shows complete at B
        for j, m in enumerate(msgs):
            if m.role == "assistant" and len(graph):
                fl, _ = _full(learned, graph, budget, signals)
                learned_at[len(graph)] = fl
                fs, rs = _full(stable, graph, budget, signals)
                kind = rs.stats.get("cache_stable") if rs is not None else "error"
                if kind == "reselected":
                    reselected_at = len(graph)
                for e in at.get(j, ()):
                    s = e.result
                    totals["events"] += 1
                    totals["learned hits"] += s in fl
                    totals["stable hits"] += s in fs
                    totals["stable hits, learned misses"] += s in fs and s not in fl
                    if s not in fl or s in fs:
                        continue
                    if rs is None:
                        c = "budget error"
                    elif kind == "reselected":
                        c = "reselected now"
                    elif s >= reselected_at:
                        c = "arrived since, not complete"
                    else:
                        kept = "learned at B showed it then" if s in learned_at.get(reselected_at, set()) else "learned at B left it out then"
                        p = float(stable.base.reuse_probabilities(graph, [s], signals)[0])  # type: ignore[attr-defined]
                        if p < cfg.predicted_tail:
                            c = f"earlier re-selection, p < predicted_tail, {kept}"
                        else:
                            c = f"earlier re-selection, no room, {kept}"
                            later = {x.result for x in events if x.turn >= j}
                            since = [q for q in rs.full if q >= reselected_at and q < len(graph) - 1]
                            totals["no room: missed result tokens"] += count(msgs[s])
                            totals["no room: history tokens"] += rs.history_tokens
                            totals["no room: appended since, tokens"] += sum(count(msgs[q]) for q in since)
                            totals["no room: appended since and never reused later, tokens"] += sum(
                                count(msgs[q]) for q in since if q not in later)
                    classes[c] += 1
            graph.append(m)
    print(json.dumps({"budget": budget, "params": params, "totals": totals, "classes": dict(classes.most_common())}, indent=1))


if __name__ == "__main__":
    main()
