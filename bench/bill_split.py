"""Where the default's bill goes on real sessions: its Anthropic-style input cost split by the kind
of request (issue 49).

Runs ``historygraph replay SESSIONS -p learned-stable -b B`` in this process and, for each request
the replay's Anthropic-style prompt cache bills, records the kind the cache-stable wrapper gave it
(``Rendering.stats["cache_stable"]``: appended, collected, reselected, expired) and the pause
before it (under 5 minutes, 5 minutes to an hour, over an hour). Prints, per kind and pause, the
requests, the tokens read from the cache and written (5-minute and 1-hour) and their cost in input
units (a read 0.1, a 5-minute write 1.25, a 1-hour write 2, uncached 1: Anthropic's multipliers,
docs.anthropic.com/en/docs/build-with-claude/prompt-caching), and each kind's share of the total;
the requests of the ``recorded`` row (the agent's own) are left out.

Usage: ``PYTHONPATH=src python bench/bill_split.py SESSIONS B [replay options...]``, e.g.
``bench/bill_split.py ../shared/sessions/claude-code 16000 -P learned-stable.old_ttl=0``.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from collections import Counter, defaultdict
from typing import Any

from historygraph.cli import app
from historygraph.eval import prompt_cache
from historygraph.policies import cache_stable

UNITS = {"read": 0.1, "write": 1.25, "write_1h": 2.0, "uncached": 1.0}
SPLIT: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
_kind: dict[str, str | None] = {"last": None}


def _pause(seconds: float) -> str:
    return "over 1 h" if seconds > 3600 else "5 min-1 h" if seconds > 300 else "under 5 min"


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit(__doc__)
    render, observe = cache_stable.CacheStable.render, prompt_cache.PromptCache.observe

    def traced_render(self: Any, graph: Any, budget: Any, signals: Any, *, keep: bool = True) -> Any:
        r = render(self, graph, budget, signals, keep=keep)
        _kind["last"] = r.stats.get("cache_stable") if budget is not None else None
        return r

    def traced_observe(self: Any, messages: Any, prompt_tokens: int, at: Any = None, *args: Any) -> Any:
        before = self.at
        t = observe(self, messages, prompt_tokens, at, *args)
        kind = _kind["last"]
        if kind is not None and self.model.name == "anthropic-style":
            _kind["last"] = None  # this policy's request is billed; the recorded row's come after it
            gap = at - before if at is not None and before is not None else 0.0
            c = SPLIT[(kind, _pause(gap))]
            c["requests"] += 1
            for field in UNITS:
                c[field] += getattr(t, field)
        return t

    cache_stable.CacheStable.render = traced_render  # type: ignore[method-assign]
    prompt_cache.PromptCache.observe = traced_observe  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        with contextlib.redirect_stdout(io.StringIO()):  # the replay's own tables (its progress stays on stderr)
            app(["replay", argv[0], "-p", "learned-stable", "-b", argv[1], "--store", f"{tmp}/s.sqlite",
                 "--out", f"{tmp}/out", *argv[2:]], prog_name="bill_split", standalone_mode=False)
    report()


def report() -> None:
    cost = {k: sum(c[f] * u for f, u in UNITS.items()) for k, c in SPLIT.items()}
    total = sum(cost.values()) or 1.0
    print(f"{'kind':12s} {'pause':12s} {'requests':>8s} {'read M':>8s} {'5-min write M':>14s} {'1-h write M':>12s} "
          f"{'input units M':>14s} {'share':>6s}")
    for (kind, pause), c in sorted(SPLIT.items(), key=lambda kv: -cost[kv[0]]):
        print(f"{kind:12s} {pause:12s} {c['requests']:8d} {c['read'] / 1e6:8.1f} {c['write'] / 1e6:14.2f} "
              f"{c['write_1h'] / 1e6:12.2f} {cost[(kind, pause)] / 1e6:14.2f} {100 * cost[(kind, pause)] / total:5.1f}%")
    by_kind: Counter[str] = Counter()
    for (kind, _), v in cost.items():
        by_kind[kind] += v
    print("by kind: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in by_kind.most_common()))


if __name__ == "__main__":
    main(sys.argv[1:])
