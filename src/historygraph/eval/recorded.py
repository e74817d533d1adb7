"""The agent's own context management as a reference row, ``recorded``, and the bill its user paid.

Claude Code and the Codex CLI manage their context themselves: when the window fills they
*compact* (Claude Code writes a summary and continues from it; Codex replaces the history by a
``replacement_history``), and every API call they make is billed with the provider's prompt cache.
Their session logs keep both, and the readers (:mod:`historygraph.traces.claude_code`,
:mod:`historygraph.traces.codex`) put them in the trace's ``meta``:

* ``meta["compactions"]``: ``{"at", "kept", "trigger", "pre_tokens", "timestamp"}`` per compaction;
  after it the agent sent ``kept`` (the summary, or the replacement history) and then
  ``messages[at:]``;
* ``meta["usage"]``: per recorded API call ``{"message", "input", "cache_read", "cache_write",
  "cache_write_1h", "output", "model", "timestamp"}`` (tokens as the provider billed them;
  ``message`` is the index of the assistant message the call produced).

:func:`recorded_context` is what the agent really sent before call ``j``; the replay scores it as
the ``recorded`` row (Later-Used Result Recall over the results it shows complete, history tokens,
and its requests through each price model's simulated cache), so every policy is compared with
the agent's own compaction on the same events. :func:`recorded_bill` prices the recorded usage:
the bill the user really paid, up to the price model's per-token prices.

What the log does not hold: the agent's system prompt and tool definitions. :func:`fixed_tokens`
estimates them from the first recorded call (its billed input minus the messages before it, in
our tokenizer) and the replay charges them to every request of every policy, so simulated and
recorded bills cover the same prompt.
"""

from __future__ import annotations

import re

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from historygraph.eval.prices import PriceModel
from historygraph.eval.prompt_cache import CacheTokens, bill
from historygraph.history.events import Message, Trace
from historygraph.signals.tokens import TokenCounter

RECORDED = "recorded"
"""The row name of the agent's own context management in a replay (not a policy: it has no rendering)."""

HOME_MODELS = (("claude", "anthropic-style"), ("gpt", "openai-style"), ("o1", "openai-style"), ("o3", "openai-style"),
               ("o4", "openai-style"), ("codex", "openai-style"), ("deepseek", "deepseek-style"))
"""Model-name prefix -> the shipped price model whose cache rule the provider has (the recorded bill
of a Claude session is priced ``anthropic-style``, of a GPT session ``openai-style``)."""


def has_recorded(trace: Trace) -> bool:
    """Whether ``trace`` carries the recorded usage of its API calls (Claude Code, Codex logs)."""
    return isinstance(trace.meta.get("usage"), list) and bool(trace.meta["usage"])


WORKTREE_DIRS = (".worktrees", "worktrees", ".claude-worktrees")  # folders agents and tools keep git worktrees in


def project_of(trace: Trace) -> str:
    """The project a session log belongs to: its git repository as ``owner/name`` where that is
    known (the ``repository_url`` Codex records, else the ``origin`` remote of the folder the agent
    ran in, when that folder is on this machine: :func:`origin_url`), so that one repository
    cloned in several folders is one project; else the folder the agent ran in (``meta["cwd"]``,
    its last two path parts; a worktree under a :data:`WORKTREE_DIRS` folder counts as its
    project), else the folder of the file (``~/.claude/projects/<project>/``); ``""`` for a
    research trace (no recorded usage)."""
    if not has_recorded(trace):
        return ""
    cwd = str(trace.meta.get("cwd") or "").rstrip("/\\")
    url = trace.meta.get("repository") or (origin_url(cwd) if cwd else None)
    if isinstance(url, str) and (name := repository_name(url)):
        return name
    if cwd:
        parts = cwd.replace("\\", "/").split("/")
        for k, part in enumerate(parts):  # a git worktree of the project (…/repo/.worktrees/3) is the project
            if part in WORKTREE_DIRS and k > 0:
                parts = parts[:k]
                break
        return "/".join(parts[-2:])
    return Path(trace.path).parent.name


_ORIGIN = re.compile(r'^\s*\[remote\s+"origin"\]\s*$(.*?)^\s*url\s*=\s*(\S+)', re.M | re.S)


def origin_url(folder: str) -> str | None:
    """The URL of the ``origin`` remote of the git checkout at ``folder`` (its ``.git/config``; for a
    worktree or submodule, whose ``.git`` is a file naming its git directory, that directory's, or
    the shared one its ``commondir`` names); ``None`` when the folder is not on this machine, is no
    checkout, or has no such remote. Reads two small files; runs no git."""
    try:
        git = Path(folder) / ".git"
        if git.is_file():
            line = git.read_text(errors="replace").strip()
            if not line.startswith("gitdir:"):
                return None
            git = (git.parent / line[len("gitdir:"):].strip()).resolve()
            common = git / "commondir"
            if common.is_file():
                git = (git / common.read_text(errors="replace").strip()).resolve()
        config = git / "config"
        if not config.is_file():
            return None
        m = _ORIGIN.search(config.read_text(errors="replace"))
    except OSError:
        return None
    if m is None or "[" in m.group(1):  # (the url of a later section)
        return None
    return m.group(2)


def repository_name(url: str) -> str:
    """``owner/name`` of a git remote URL (``https://github.com/owner/name.git``,
    ``git@github.com:owner/name.git``, ``ssh://git@host/owner/name``); ``""`` when it has no two
    path parts."""
    path = url.strip().rstrip("/")
    path = path.split("://", 1)[-1]
    path = path.split(":", 1)[-1] if "@" in path.split("/", 1)[0] else path.split("/", 1)[-1] if "/" in path else ""
    parts = [p for p in path.removesuffix(".git").split("/") if p]
    return "/".join(parts[-2:]) if len(parts) >= 2 else ""


def home_price_model(trace: Trace) -> str | None:
    """The price model of the trace's recorded model (:data:`HOME_MODELS`), ``None`` when unknown."""
    name = str(trace.meta.get("model") or "").lower()
    if not name:
        models = [u.get("model") for u in trace.meta.get("usage") or () if u.get("model")]
        name = str(max(set(models), key=models.count)).lower() if models else ""
    for prefix, model in HOME_MODELS:
        if name.startswith(prefix):
            return model
    return None


@dataclass(frozen=True)
class Compaction:
    at: int
    kept: tuple[Message, ...]


def compactions(trace: Trace) -> list[Compaction]:
    """The trace's compactions in order (``meta["compactions"]``)."""
    out = []
    for c in trace.meta.get("compactions") or ():
        out.append(Compaction(int(c["at"]), tuple(Message.from_openai(m) for m in c.get("kept") or ())))
    return sorted(out, key=lambda c: c.at)


class RecordedContext:
    """What the agent sent at each call of one trace (module docstring)."""

    def __init__(self, trace: Trace) -> None:
        self.messages = trace.messages
        self.compactions = compactions(trace)

    def at(self, j: int) -> tuple[list[Message], range]:
        """The messages the agent sent before call ``j`` (the assistant message at index ``j``) and
        the range of trace positions among them: the latest compaction's ``kept`` messages, then
        ``messages[at:j]``; without a compaction, ``messages[:j]``."""
        start = 0
        kept: tuple[Message, ...] = ()
        for c in self.compactions:
            if c.at <= j:
                start, kept = c.at, c.kept
        return list(kept) + list(self.messages[start:j]), range(start, j)


def recorded_context(trace: Trace, j: int) -> list[Message]:
    """The context the agent sent before call ``j`` (:meth:`RecordedContext.at`)."""
    return RecordedContext(trace).at(j)[0]


def uses_one_hour_cache(trace: Trace) -> bool:
    """Whether the agent wrote its prompt cache with Anthropic's 1-hour TTL: at least half of the
    recorded cache writes are 1-hour writes (Claude Code asks for it on some accounts)."""
    return one_hour_tokens(recorded_tokens(trace)[0])


def one_hour_tokens(t: CacheTokens) -> bool:
    """:func:`uses_one_hour_cache` from a session's summed billed input (:func:`recorded_tokens`): the
    1-hour writes are at least half of all cache writes (tokens)."""
    return t.write_1h * 2 >= max(1, t.write + t.write_1h)


def recorded_tokens(trace: Trace) -> tuple[CacheTokens, int]:
    """Σ over the recorded calls: input tokens by how they were billed (read from the cache, written
    to it at the 5-minute and at the 1-hour rate, uncached), and the output tokens."""
    read = write = write_1h = uncached = output = 0
    for u in trace.meta.get("usage") or ():
        read += int(u.get("cache_read") or 0)
        w1 = int(u.get("cache_write_1h") or 0)
        write += int(u.get("cache_write") or 0) - w1
        write_1h += w1
        uncached += int(u.get("input") or 0)
        output += int(u.get("output") or 0)
    return CacheTokens(read=read, write=write, uncached=uncached, write_1h=write_1h), output


def recorded_bill(trace: Trace, model: PriceModel) -> float:
    """USD the recorded calls cost under ``model``'s prices: uncached input, cache reads, cache
    writes (1-hour writes at ``ONE_HOUR_WRITE`` × input, :mod:`.prompt_cache`) and output."""
    return recorded_bill_tokens(recorded_tokens(trace), model)


def recorded_bill_tokens(recorded: tuple[CacheTokens, int], model: PriceModel) -> float:
    """:func:`recorded_bill` of the sums :func:`recorded_tokens` gave."""
    t, output = recorded
    return bill(model, t, output)


@dataclass(frozen=True)
class CacheCall:
    """One recorded request as the simulation billed it (``simulated``: the price model of the
    recorded model, on what the agent sent) and as the provider did (``read``, ``write``, ``uncached``
    tokens of its recorded usage): the cache check."""

    message: int
    simulated: CacheTokens
    recorded: CacheTokens


def recorded_call(u: dict[str, Any]) -> CacheTokens:
    """The input tokens of one recorded call by how they were billed."""
    w1 = int(u.get("cache_write_1h") or 0)
    return CacheTokens(int(u.get("cache_read") or 0), int(u.get("cache_write") or 0) - w1, int(u.get("input") or 0), w1)


def share(t: CacheTokens) -> float:
    """The part of a request's input read from the cache (0 for an empty request)."""
    return t.read / t.total if t.total else 0.0


def cache_check(calls: list[CacheCall]) -> dict[str, Any]:
    """How the simulated cache agrees with the recorded bills over ``calls``: Σ tokens read, written
    and uncached on both sides, the read share of all input (simulated, recorded), and per call the
    mean and median absolute difference of the read share (percentage points); ``{}`` for none."""
    if not calls:
        return {}
    sim = sum((c.simulated for c in calls), CacheTokens())
    rec = sum((c.recorded for c in calls), CacheTokens())
    diffs = sorted(abs(share(c.simulated) - share(c.recorded)) * 100 for c in calls)
    mid = len(diffs) // 2
    median = diffs[mid] if len(diffs) % 2 else (diffs[mid - 1] + diffs[mid]) / 2
    return {"calls": len(calls), "simulated": asdict(sim), "recorded": asdict(rec),
            "read_share_simulated": round(100 * share(sim), 2), "read_share_recorded": round(100 * share(rec), 2),
            "input_ratio": round(sim.total / rec.total, 4) if rec.total else None,
            "read_share_error_mean": round(sum(diffs) / len(diffs), 2), "read_share_error_median": round(median, 2)}


def billed_input(u: dict[str, Any]) -> int:
    """All input tokens of one recorded call (uncached + cache read + cache write)."""
    return int(u.get("input") or 0) + int(u.get("cache_read") or 0) + int(u.get("cache_write") or 0)


def fixed_tokens(trace: Trace, counter: TokenCounter) -> int:
    """Estimated tokens of the system prompt and tool definitions the agent sends with every call
    but its log does not hold: the first recorded call's billed input minus the messages before it
    (counted with ``counter``, which is not the provider's tokenizer: an estimate), at least 0."""
    usage = trace.meta.get("usage") or ()
    if not usage:
        return 0
    first = usage[0]
    before = RecordedContext(trace).at(int(first["message"]))[0]
    return max(0, billed_input(first) - counter.count_messages(before))
