"""Summaries for the condensing baselines: prompt, content-hash cache, usage, and condensation chains.

**Prompt** (ContextRender B.2 describes its content; the wording is ours): the summary is organised
under *files read, key observations, commands run, decisions, unresolved questions*, and numbers,
configuration keys, paths, identifiers and error strings are to be copied verbatim. When an earlier
summary exists it is given to the model to merge with the new history (B.2, Recency + Summary).

**Prompt size** (documented truncation, for CPU feasibility): the new history is rendered as one
block per message (``[role]`` or ``[tool result <id>]``, then its text and tool calls), each block
clipped to its head of ``prompt_chars // len(messages)`` characters (at least 40); when the blocks
together are still longer than ``prompt_chars`` (many short messages), only the last
``prompt_chars`` characters are kept, the older part being covered by the previous summary. The
previous summary is clipped to ``prompt_chars // 2`` characters. The model writes at most
``max_summary_tokens`` tokens.

**Cache**: a summary is keyed by the sha256 of the model name, :data:`PROMPT_VERSION`, the output
cap and the full prompt, and stored with ``store.put_text("summary", key, text)`` (in-process when
the signals carry no store). A cached summary costs no model call.

**Usage** (ContextRender C.2): every model call adds its input and output tokens and seconds to the
render's :class:`~historygraph.models.chat.ModelUsage`, reported in ``Rendering.stats`` as
``model_calls``, ``model_input_tokens``, ``model_output_tokens`` and ``model_seconds``.

**Condensation chain**: a summarising policy replaces the oldest history by one summary that it
extends over time. The chain is a pure function of the graph, B and the policy's trigger: the
policy is evaluated at every invocation point (the prefix before each assistant message, and the
whole graph), and whenever its *view* (first user message, the current summary, and the history
after it) exceeds B and the trigger fires, the units it names are condensed together with the
previous summary into a new one. Condensing only when the view exceeds B follows docs/architecture.md, invariant §5.5
(an under-budget history is returned unchanged); it is our decision where the papers count
observations or turns without a token budget. The chain found so far is memoised per session and
budget and checked against the graph prefix, so each render only looks at the new invocation points.

A summary is rendered as a user message marked ``rendered_as="summary"`` right after the last
position it covers; it names the positions and the first and last tool-result ids it replaces,
is charged to B first, and never counts as a complete result (ContextRender B.4).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.models.chat import ModelUsage
from historygraph.render import Layout, Rendering
from historygraph.policies.base import Signals
from historygraph.policies.baselines.full_prune import newest_first

PROMPT_VERSION = "historygraph-summary-v1"
SUMMARY_INSTRUCTIONS = (
    "You condense the working history of a software agent so that it can carry on without the original "
    "messages. Write a short summary with these five headings: Files read; Key observations; Commands run; "
    "Decisions; Unresolved questions. Under each heading use terse bullet points. Copy numbers, configuration "
    "keys, file paths, identifiers and error messages exactly as written. If a previous summary is given, "
    "merge it with the new history into one summary; drop nothing important from it."
)
SUMMARY_HEADER = ("[summary of earlier history: replaces messages {first}-{last} ({results} tool results, ids {id0} .. "
                  "{id1}); the originals are stored in full and can be restored by id]\n")


def usage_stats(usage: ModelUsage) -> dict[str, Any]:
    """The ``Rendering.stats`` entries of one render's model usage."""
    return {"model_calls": usage.calls, "model_input_tokens": usage.input_tokens,
            "model_output_tokens": usage.output_tokens, "model_seconds": usage.seconds}


def history_text(messages: list[Message], prompt_chars: int) -> str:
    """The new history as the summariser sees it (per-message head clipping, module docstring)."""
    if not messages:
        return ""
    share = max(40, prompt_chars // len(messages))
    lines = []
    for m in messages:
        head = f"[tool result {m.tool_call_id}]" if m.role == "tool" else f"[{m.role}]"
        calls = "".join(f" -> {c.name} {c.arguments}" for c in m.tool_calls)
        body = (m.content + calls)[:share]
        lines.append(f"{head} {body}" + (" …" if len(m.content + calls) > share else ""))
    text = "\n".join(lines)
    return text if len(text) <= prompt_chars else "… " + text[-prompt_chars:]


def summary_prompt(previous: str | None, messages: list[Message], prompt_chars: int) -> list[dict[str, str]]:
    """OpenAI-form chat messages asking for a (merged) summary."""
    parts = []
    if previous:
        parts.append("Previous summary:\n" + previous[:prompt_chars // 2])
    parts.append("New history:\n" + history_text(messages, prompt_chars))
    parts.append("Write the " + ("merged " if previous else "") + "summary now.")
    return [{"role": "system", "content": SUMMARY_INSTRUCTIONS}, {"role": "user", "content": "\n\n".join(parts)}]


class Summarizer:
    """Calls ``signals.model`` for a summary unless the cache already has it.

    Raises:
        historygraph.models.chat.ModelError: the model cannot be loaded or the call failed.
    """

    def __init__(self, max_summary_tokens: int, prompt_chars: int, version: str = PROMPT_VERSION) -> None:
        self.max_summary_tokens, self.prompt_chars, self.version = max_summary_tokens, prompt_chars, version
        self._memo: dict[str, str] = {}

    def summarize(self, signals: Signals, previous: str | None, messages: list[Message], usage: ModelUsage) -> str:
        """The (merged) summary of ``messages`` with the prompt of :func:`summary_prompt`."""
        return self.complete(signals, summary_prompt(previous, messages, self.prompt_chars), usage)

    def complete(self, signals: Signals, prompt: list[dict[str, str]], usage: ModelUsage) -> str:
        """The model's answer to ``prompt``, from the cache when it has it (key: model name,
        ``version``, output cap, prompt); a model call adds its tokens and seconds to ``usage``."""
        model = signals.model
        key = hashlib.sha256(json.dumps([model.name, self.version, self.max_summary_tokens, prompt]).encode()).hexdigest()
        store = signals.store
        cached = store.get_text("summary", key) if store is not None else self._memo.get(key)
        if cached is not None:
            return cached
        c = model.complete(prompt, max_tokens=self.max_summary_tokens)
        usage.add(c)
        text = c.text.strip() or "(the summariser returned no text)"
        if store is not None:
            store.put_text("summary", key, text)
        else:
            self._memo[key] = text
        return text


@dataclass(frozen=True)
class Condensation:
    """One link of a chain: the summary of every position in ``covered`` (cumulative)."""

    covered: frozenset[int]
    last: int
    text: str


@dataclass
class View:
    """The history a policy sees at an invocation point ``k`` (prefix ``messages[:k]``).

    ``units`` are the condensable units after the current summary, oldest first (lists of
    positions; the first user message, the current user message and the latest assistant unit are
    protected and not listed; a policy with ``keeps_users`` lists no user message and counts every
    earlier one as kept); ``tokens`` is the cost of the whole view with the summary, in B's
    tokens; ``observations`` and ``turns`` count tool results and assistant messages in it.
    """

    k: int
    units: list[list[int]]
    unit_tokens: list[int]
    tokens: int
    observations: int
    turns: int


class CondensingPolicy:
    """Base of the summarising policies. Subclasses set ``Config`` (with ``max_summary_tokens`` and
    ``prompt_chars``) and implement :meth:`plan` (how many leading view units to condense, 0 for
    none) and may override :meth:`fill` (which results of the rendered view to show in full) and
    :meth:`layout` (e.g. a different placeholder)."""

    Config: type
    #: keep every user message verbatim instead of condensing it (Codex-style summarization, ReCAP §4)
    keeps_users: bool = False
    summary_header: str = SUMMARY_HEADER
    prompt_version: str = PROMPT_VERSION

    def __init__(self, name: str, config: Any = None) -> None:
        self.name, self.config = name, config or self.Config()
        self.summarizer = Summarizer(self.config.max_summary_tokens, self.config.prompt_chars, self.prompt_version)
        self._chains: dict[tuple[str, int | None], tuple[int, int, list[Condensation]]] = {}

    def plan(self, view: View, budget: int, graph: ContextGraph) -> int:
        raise NotImplementedError

    def layout(self, graph: ContextGraph, signals: Signals, budget: int | None, **kw: Any) -> Layout:
        return Layout(graph, signals.counter, budget, **kw)

    def fill(self, layout: Layout, graph: ContextGraph) -> Any:
        """Default: the view's results newest first while they fit in B (as Prune)."""
        return newest_first(layout, "kept: after the summary, newest first, fits",
                            "omitted: after the summary, does not fit in B")

    def condense(self, signals: Signals, previous: str | None, graph: ContextGraph, k: int, positions: list[int],
                 usage: ModelUsage) -> str:
        """The new summary at invocation point ``k`` of the ``positions`` condensed now, merging
        ``previous`` (default: the prompt of :func:`summary_prompt`)."""
        return self.summarizer.summarize(signals, previous, [graph.messages[p] for p in positions], usage)

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        plain = self.layout(graph, signals, budget)  # raises BudgetTooSmallError before any model call
        usage = ModelUsage()
        if plain.fits_in_full:
            r = plain.assemble_full(self.name)
        else:
            chain = self.chain(graph, budget, signals, usage)
            if not chain:
                r = plain.assemble(self.name, self.fill(plain, graph))
            else:
                assert budget is not None  # (no budget: the history fits)
                r = self._render_summary(graph, budget, signals, plain, chain[-1])
        r.stats.update(usage_stats(usage))
        return r

    def _render_summary(self, graph: ContextGraph, budget: int, signals: Signals, plain: Layout,
                        c: Condensation) -> Rendering:
        msgs, counter = graph.messages, signals.counter
        ids = [msgs[p].tool_call_id for p in sorted(c.covered) if msgs[p].role == "tool"]
        header = self.summary_header.format(first=min(c.covered), last=c.last, results=len(ids),
                                            id0=ids[0] if ids else "-", id1=ids[-1] if ids else "-")
        protected = sum(u.cost for u in plain.units
                        if u.protected or (self.keeps_users and msgs[u.positions[0]].role == "user"))
        room = budget - protected - counter.count_message(Message("user", header))
        text = counter.truncate(c.text, max(0, room))
        summary = Message("user", header + text, rendered_as="summary")
        layout = self.layout(graph, signals, budget, omit=c.covered, inserts={c.last: summary})
        for p in c.covered:
            layout.reasons[p] = f"summarised (summary after position {c.last})"
        return layout.assemble(self.name, self.fill(layout, graph))

    # -- the chain ------------------------------------------------------------------------
    def chain(self, graph: ContextGraph, budget: int | None, signals: Signals, usage: ModelUsage) -> list[Condensation]:
        """The condensations up to now (see module docstring), extending the memoised chain."""
        msgs = graph.messages
        n = len(msgs)
        key = (graph.session_id, budget)
        checked, links = 0, []
        memo = self._chains.get(key)
        if memo is not None and memo[0] <= n and memo[1] == hash(tuple(msgs[:memo[0]])):
            checked, links = memo[0], list(memo[2])
        if budget is not None:
            tok = [0 if m.role == "system" else signals.counter.count_message(m) for m in msgs]
            for k in range(checked + 1, n + 1):
                if k < n and msgs[k].role != "assistant":
                    continue
                view = self._view(graph, k, tok, links[-1] if links else None, signals)
                if view.tokens <= budget:
                    continue
                i = self.plan(view, budget, graph)
                if i <= 0:
                    continue
                new = [p for u in view.units[:i] for p in u]
                prev = links[-1] if links else None
                text = self.condense(signals, prev.text if prev else None, graph, k, sorted(new), usage)
                covered = (prev.covered if prev else frozenset()) | frozenset(new)
                links.append(Condensation(covered, max(covered), text))
        self._chains[key] = (n, hash(tuple(msgs)), links)
        return links

    def _view(self, graph: ContextGraph, k: int, tok: list[int], last: Condensation | None, signals: Signals) -> View:
        msgs = graph.messages
        users = [p for p in range(k) if msgs[p].role == "user"]
        first_user, current_user = (users[0], users[-1]) if users else (None, None)
        assistants = [p for p in range(k) if msgs[p].role == "assistant"]
        last_assistant = assistants[-1] if assistants else None
        covered = last.covered if last else frozenset()
        units: list[list[int]] = []
        for p in range(k):
            m = msgs[p]
            if p in covered or p in (first_user, current_user, last_assistant):
                continue
            if m.role == "user":
                if not self.keeps_users:
                    units.append([p])
            elif m.role == "assistant":
                units.append([p] + [graph.result_of[c.id] for c in m.tool_calls
                                    if graph.result_of.get(c.id, k) < k])
        unit_tokens = [sum(tok[p] for p in u) for u in units]
        kept = [p for p in (users if self.keeps_users else [first_user]) if p is not None and p != current_user]
        tail = []
        if last_assistant is not None:
            tail = [last_assistant] + [graph.result_of[c.id] for c in msgs[last_assistant].tool_calls
                                       if graph.result_of.get(c.id, k) < k]
        tokens = sum(unit_tokens) + sum(tok[p] for p in kept + tail)
        if last is not None:
            tokens += signals.counter.count_message(Message("user", self.summary_header + last.text))
        in_view = [p for u in units for p in u] + tail
        return View(k, units, unit_tokens, tokens, sum(msgs[p].role == "tool" for p in in_view),
                    sum(msgs[p].role == "assistant" for p in in_view))
