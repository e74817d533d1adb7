"""A provider's prompt cache simulated on one policy's requests, and the bill it gives.

The replay gives, per policy and trace, the sequence of complete model inputs: the tool schemas
(``fixed`` tokens leading every request), then the rendered messages (``Rendering.input_tokens``).
:class:`PromptCache` carries a cache from call to call and splits each request's input into tokens
read from the cache, written to it, and uncached (:class:`CacheTokens`), under the rule of a
:class:`~historygraph.eval.prices.PriceModel`. Time is the call index: each agent call is one unit,
an entry unused for more than ``ttl_calls`` calls expires and a hit renews what it used (OpenAI keeps a prefix
for some minutes of inactivity; Anthropic's TTL "is refreshed for no additional cost each time the
cached content is used"). Where the trace records when each call was made (Claude Code and Codex
logs), time is in seconds instead: an entry unused for more than the model's ``ttl_seconds``
expires (5 minutes), or for an hour with ``one_hour``, the TTL a session's recorded usage shows it
used (its writes then billed at :data:`ONE_HOUR_WRITE` × input): on twelve Claude Code sessions of
the development set, 4.0 of the 7.7 million tokens Anthropic billed as cache writes came after
pauses of more than 5 minutes, which a clock of calls cannot see (docs/evaluator.md, "Real
sessions"). A budget error sends no request but still takes a unit of time.
Prefixes are compared with :mod:`historygraph.eval.cache` (per message, then per token).

``caching = "automatic"`` (OpenAI, DeepSeek): every request of at least ``min_tokens`` tokens is
cached; a request reads the longest prefix it shares with a live entry, rounded down to
``min_tokens`` plus whole ``step`` units and 0 below ``min_tokens`` (OpenAI: 1,024, then 128-token
increments, platform.openai.com/docs/guides/prompt-caching; DeepSeek: 64-token storage units,
api-docs.deepseek.com/guides/kv_cache). No write is billed: the rest is uncached input. With
``min_tokens = 0, step = 1, ttl_calls = 1`` this is exactly :class:`~.cache.PrefixReuse`'s figure.

``caching = "breakpoints"`` (Anthropic, docs.anthropic.com/en/docs/build-with-claude/prompt-caching):
only prefixes that end at a ``cache_control`` breakpoint are cached, and a hit needs an earlier
entry that is an exact prefix of the request and ends at most ``lookback_blocks`` content blocks
before a breakpoint. **Where the simulation puts breakpoints** (the documented rule, as clients such
as Claude Code do): one after the tools and the leading system messages, one on the last message
of each request, and one on the opening, the first message after the system messages (the task,
which every rendering keeps while a re-selection rewrites what follows it: on the 14 mini-swe-agent
trajectories at B = 6000 it lowers `learned-stable`'s Anthropic-style cost from 1.01 to 0.91 of
Full history's, docs/evaluator.md), and, for a cache-stable rendering with a young generation
(:mod:`historygraph.policies.cache_stable`), one at the end of its old generation and, at a
collection, one at the end of the new one (``boundaries``). At most 4, as a request may carry,
kept in that order: the last message's, the system prompt's, the generations', the opening's. The proxy puts its own there too
(:mod:`historygraph.providers.anthropic_cache`, ``serve --cache-breakpoints``); keep the two rules
the same. Content blocks are counted per message: its
text (when not empty) and each tool call. A request of at least ``min_tokens`` reads the longest
matching entry and writes the rest up to its last breakpoint (``cache_write`` price); a shorter
one is neither read nor written (uncached).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from historygraph.eval.cache import differing_message_tokens, equal_leading
from historygraph.eval.prices import PriceModel
from historygraph.providers.anthropic_cache import MAX_BREAKPOINTS
from historygraph.history.events import Message
from historygraph.signals.tokens import TokenCounter

ENCODE_MEMO = 512  # token ids of the contents compared most recently (the same few per call)


ONE_HOUR_WRITE = 2.0
"""A 1-hour cache write costs 2× the base input price (Anthropic prompt caching: 1-hour cache writes
cost twice the base input price, 5-minute ones 1.25×; docs.anthropic.com/en/docs/build-with-claude/prompt-caching)."""
ONE_HOUR = 3600.0  # seconds an entry written with the 1-hour TTL lives unused


@dataclass
class CacheTokens:
    """Input tokens of one or more requests by how a provider bills them (``write_1h``: written with
    Anthropic's 1-hour TTL, at :data:`ONE_HOUR_WRITE` × input)."""

    read: int = 0
    write: int = 0
    uncached: int = 0
    write_1h: int = 0

    def __add__(self, other: "CacheTokens") -> "CacheTokens":
        return CacheTokens(self.read + other.read, self.write + other.write, self.uncached + other.uncached,
                           self.write_1h + other.write_1h)

    @property
    def total(self) -> int:
        return self.read + self.write + self.uncached + self.write_1h


def input_cost(model: PriceModel, t: CacheTokens) -> float:
    """USD of the input tokens ``t`` under ``model``."""
    return (t.read * model.cached_input + t.write * model.write_price + t.uncached * model.input
            + t.write_1h * model.input * ONE_HOUR_WRITE) / 1e6


def bill(model: PriceModel, t: CacheTokens, output: int, embedding: int = 0, model_input: int = 0) -> float:
    """USD of one policy on one trace: its agent requests ``t`` through the cache, ``output`` tokens,
    ``embedding`` tokens, and ``model_input`` tokens of its summariser/analyser calls (billed as
    uncached input: their prompts differ from the agent's)."""
    return input_cost(model, t) + (output * model.output + embedding * model.embedding + model_input * model.input) / 1e6


def round_hit(model: PriceModel, match: int) -> int:
    """The cached part of a ``match``-token shared prefix: 0 below ``min_tokens``, else
    ``min_tokens`` plus whole ``step`` units."""
    if match < max(model.min_tokens, 1):
        return 0
    return model.min_tokens + (match - model.min_tokens) // model.step * model.step


def blocks(m: Message) -> int:
    """Content blocks of a message (text when not empty, one per tool call; at least one)."""
    return max(1, (1 if m.content else 0) + len(m.tool_calls))


@dataclass
class Entry:
    """A cached prefix: the leading ``messages`` (after the tool schemas), its tokens, and the call
    that last used it."""

    messages: list[Message]
    tokens: int
    used: int
    used_at: float | None = None  # seconds since the epoch of that call, when the trace records it
    ttl: float | None = None      # seconds it lives unused when not the cache's (a young generation's shorter TTL)


@dataclass
class PromptCache:
    """The cache of one provider (``model``) over one policy's requests on one trace: feed every
    request to :meth:`observe` (or :meth:`skip`) in call order; ``total`` sums what they were billed."""

    model: PriceModel
    counter: TokenCounter
    fixed: int = 0                 # tool-schema tokens leading every request
    one_hour: bool = False         # breakpoints written with the 1-hour TTL (as the agent of a session did)
    total: CacheTokens = field(default_factory=CacheTokens)
    entries: list[Entry] = field(default_factory=list)
    now: int = 0
    at: float | None = None        # the current call's time (seconds), when known
    _memo: dict[str, list[int]] = field(default_factory=dict)

    @property
    def ttl_seconds(self) -> float:
        """Seconds an unused entry lives, 0 when time is counted in calls only."""
        return ONE_HOUR if self.one_hour and self.model.caching == "breakpoints" else self.model.ttl_seconds

    def _alive(self, e: Entry) -> bool:
        ttl = e.ttl if e.ttl is not None and self.model.caching == "breakpoints" else self.ttl_seconds
        if self.at is not None and e.used_at is not None and ttl:
            return self.at - e.used_at <= ttl
        return self.now - e.used <= self.model.ttl_calls

    def encode(self, text: str) -> list[int]:
        ids = self._memo.get(text)
        if ids is None:
            if len(self._memo) >= ENCODE_MEMO:
                self._memo.clear()
            ids = self._memo[text] = self.counter.encode(text)
        return ids

    def observe(self, messages: Sequence[Message], prompt_tokens: int, at: float | None = None,
                boundaries: Sequence[int] = (), young_ttl: float | None = None,
                old_ttl: float | None = None) -> CacheTokens:
        """Bill one request: ``messages`` of ``prompt_tokens`` tokens (without the tool schemas), made
        at ``at`` seconds since the epoch when known (then entries expire after the model's
        ``ttl_seconds`` unused, or an hour with ``one_hour``; else after ``ttl_calls`` calls).
        ``boundaries``: the request also carries a breakpoint after its first ``b`` messages for each
        ``b`` (the end of a cache-stable rendering's old generation,
        ``Rendering.stats["cache_boundaries"]``; module docstring). ``young_ttl``: with ``one_hour``
        and boundaries, the breakpoints after the last boundary (the young generation's) carry this
        shorter TTL and what they write is billed at the 5-minute price
        (``Rendering.stats["cache_young_ttl"]``). ``old_ttl``: without ``one_hour``, the breakpoints up
        to the last boundary (the old generation's, and the system prompt's) carry this longer TTL
        and what they write is billed at the 1-hour price (``Rendering.stats["cache_old_ttl"]``)."""
        self.now += 1
        self.at = at
        self.entries = [e for e in self.entries if self._alive(e)]
        size = prompt_tokens + self.fixed
        if self.model.caching == "automatic":
            t = self._automatic(list(messages), size)
        else:
            t = self._breakpoints(list(messages), size, boundaries, young_ttl, old_ttl)
        self.total = self.total + t
        return t

    def skip(self, at: float | None = None) -> None:
        """A call without a request (budget error): time passes, nothing is billed."""
        self.now += 1
        self.at = at

    def _cumulative(self, messages: list[Message]) -> list[int]:
        out = [self.fixed]
        for m in messages:
            out.append(out[-1] + self.counter.count_message(m))
        return out

    def _automatic(self, messages: list[Message], size: int) -> CacheTokens:
        """Longest shared prefix with a live entry (longest entries first, until no entry can
        beat the best; per message, then per token at the first difference), rounded by :func:`round_hit`. The request
        becomes an entry; the entry it matched is not renewed: what was used of it, the shared
        prefix, is a prefix of the new entry (a prefix cache renews exactly that part)."""
        cum = self._cumulative(messages)
        best, n = 0, len(messages)
        for e in sorted(self.entries, key=lambda e: -e.tokens):
            if min(e.tokens, size) <= best:  # no later entry (fewer tokens) can beat it either
                break
            k = equal_leading(e.messages, messages)
            match = cum[k]
            if k < n and k < len(e.messages) and cum[k + 1] > best:
                match += differing_message_tokens(e.messages[k], messages[k], self.counter, self.encode)
            best = max(best, min(match, e.tokens, size))
        if size >= max(self.model.min_tokens, 1):
            self.entries.append(Entry(messages, size, self.now, self.at))
        read = round_hit(self.model, best)
        return CacheTokens(read=read, uncached=size - read)

    def _breakpoints(self, messages: list[Message], size: int, boundaries: Sequence[int] = (),
                     young_ttl: float | None = None, old_ttl: float | None = None) -> CacheTokens:
        """Breakpoints on the last message, after the tools and system messages, after the first ``b``
        messages for each of ``boundaries`` and on the opening, the first 4 of those (module docstring); a hit is a live entry that is a whole prefix ending within ``lookback_blocks``
        blocks before one of them."""
        if size < self.model.min_tokens:
            return CacheTokens(uncached=size)
        cum = self._cumulative(messages)
        nblocks = [0]
        for m in messages:
            nblocks.append(nblocks[-1] + blocks(m))
        system = 0
        while system < len(messages) and messages[system].role == "system":
            system += 1
        points = [len(messages)] + ([system] if cum[system] > 0 and system < len(messages) else [])
        points += [b for b in boundaries if system + 1 < b < len(messages)]  # a cache-stable rendering's generations
        if system + 1 < len(messages):
            points.append(system + 1)  # the opening: the first message after the system prompt
        points = list(dict.fromkeys(points))[:MAX_BREAKPOINTS]
        best = None
        for e in self.entries:
            k = len(e.messages)
            if k > len(messages) or equal_leading(e.messages, messages) < k:
                continue
            if any(k <= p and nblocks[p] - nblocks[k] <= self.model.lookback_blocks for p in points):
                if best is None or e.tokens > best.tokens:
                    best = e
        read = 0
        if best is not None:
            best.used, best.used_at, read = self.now, self.at, best.tokens
        split = young_ttl if self.one_hour else old_ttl  # a request whose generations carry two TTLs
        old = max((b for b in boundaries if b in points), default=None) if split else None
        for p in sorted(points):
            ttl = None  # the cache's own: the hour's under one_hour, else the model's 5 minutes
            if old is not None and self.one_hour and p > old:
                ttl = young_ttl
            elif old is not None and not self.one_hour and p <= old:
                ttl = old_ttl
            self._write(messages[:p], cum[p], ttl)
        if old is not None:  # 1-hour writes up to the old generation's end, 5-minute ones after it
            long = max(0, cum[old] - read)
            return CacheTokens(read=read, write_1h=long, write=size - read - long)
        if self.one_hour:
            return CacheTokens(read=read, write_1h=size - read)
        return CacheTokens(read=read, write=size - read)

    def _write(self, prefix: list[Message], tokens: int, ttl: float | None = None) -> None:
        """Cache the prefix ending at a breakpoint (renew it when already cached; ``ttl``: its own TTL)."""
        if tokens < self.model.min_tokens:
            return
        for e in self.entries:
            if len(e.messages) == len(prefix) and e.tokens == tokens and equal_leading(e.messages, prefix) == len(prefix):
                e.used, e.used_at = self.now, self.at
                return
        self.entries.append(Entry(prefix, tokens, self.now, self.at, ttl))
