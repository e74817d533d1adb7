"""ReCAP's Codex-style summarization baseline: a handoff summary, every user instruction verbatim.

Source: ReCAP, "Persistent Context Graphs for Efficient Memory Compaction in LLM Agents", §5
(experiments; the paper's cross-references put the method in §4), Baselines: Codex-style
summarization (OpenAI, 2025) is a memory-compaction baseline in which the backbone writes a handoff
summary and the earlier user instructions are preserved; End-to-end protocol: the summariser chooses
its own summary length; every compactor works on the history before the current user turn, with
system instructions and the current turn kept apart. The reference implementation, the compaction
of the OpenAI Codex CLI (2025), rebuilds the history as its initial context, the earlier user
messages and then the summary.

What ``codex-summary`` renders once the history exceeds B:

* system messages and the current user message (outside B, as for every policy);
* **every earlier user message verbatim, in its original order** (never condensed);
* one **handoff summary** (a user message marked ``rendered_as="summary"``) right after the last
  position it stands for, so it follows the user instructions it accompanies, as in Codex;
* the current step (the latest assistant message with its results, possibly an in-flight call)
  and any history newer than the summary.

**When** (our decision where the paper is silent, shared with the other summarising policies of
:mod:`historygraph.policies.baselines.summary`): ReCAP compacts when a new user turn arrives; in one-turn
agent traces (mini-swe-agent) B is exceeded inside the turn, so a summary is written at every
invocation point where the view (user messages, current summary, newer history) exceeds B, as
Codex's automatic compaction does when its context limit is reached mid-turn. Each new summary is
written from the previous one plus the history condensed since, so it covers all earlier work.

**Prompt** (the wording is ours; the content follows Codex's handoff prompt): the model writes a
summary for another assistant that will resume the task: progress and decisions so far, the
constraints and user preferences that matter, what remains to be done, and the exact data needed to
continue (paths, identifiers, commands, error messages, numbers). It is given the user instructions
(``prompt_chars // 4`` characters, each clipped to its head, :func:`instructions_text`: they stay
verbatim in the rendering anyway), the
previous summary (``prompt_chars // 2``) and the newly condensed history (``prompt_chars``, as
:func:`~historygraph.policies.baselines.summary.history_text` clips it).

**Length**: the model stops when it is done, at most ``max_summary_tokens = 64`` model tokens (our
cap, for the local CPU model: ReCAP §5 reports 285–591 output tokens per summarisation on LiC from
20–30B backbones; SmolLM2-135M rarely stops by itself, and on the shared 2-core machine 128 tokens
cost about 2 minutes per call, which would have put the 14-trajectory run past two hours); the summary is cut further only when the user messages and the current step leave less
room in B. When the earlier user messages and the current step alone exceed B (never on the shared
traces at B = 6000: at most 1,342 tokens of earlier user messages), the shared
:class:`~historygraph.render.Layout` drops the oldest user messages but the first, each with a
dropped-step marker, until half of B is left (Codex likewise keeps only its newest user messages
within a cap).

**Model**: the paper's summariser is the agent's backbone; here it is the configured chat model
(an OpenAI-compatible endpoint, else SmolLM2-135M-Instruct on the CPU), as for every summarising
policy. Calls are cached by content hash and charged (tokens and seconds) like theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.models.chat import ModelUsage
from historygraph.policies.base import Signals
from historygraph.policies.registry import register
from historygraph.policies.baselines.condensers import check_summary
from historygraph.policies.baselines.summary import CondensingPolicy, View, history_text

HANDOFF_VERSION = "historygraph-handoff-v1"
HANDOFF_INSTRUCTIONS = (
    "The work below will be continued by another assistant that cannot see it. Write a handoff summary "
    "for that assistant: what has been done so far and the decisions taken; the facts, constraints and user "
    "preferences that still matter; what remains to be done, as concrete next steps; and the exact data needed "
    "to continue (file paths, identifiers, commands, error messages, numbers). If a previous handoff summary is "
    "given, fold it into the new one. Be concise and structured; the user's instructions are passed on verbatim, "
    "so do not repeat them."
)
HANDOFF_HEADER = ("[handoff summary of the earlier work: stands for messages {first}-{last} except the user messages, "
                  "which are shown verbatim ({results} tool results, ids {id0} .. {id1}); the originals are stored in "
                  "full and can be restored by id]\n")


def instructions_text(users: list[Message], limit: int) -> str:
    """The user instructions as the summariser sees them: each ``[user]`` message clipped to its head
    of ``max(40, limit // len(users) − 10)`` characters (10: the ``[user] `` label, the `` …`` mark and
    the newline); when they are still longer than ``limit`` (many messages), the first and the last
    ``limit // 2`` characters are kept."""
    if not users:
        return ""
    share = max(40, limit // len(users) - 10)
    text = "\n".join(f"[user] {m.content[:share]}" + (" …" if len(m.content) > share else "") for m in users)
    return text if len(text) <= limit else text[:limit // 2] + " … " + text[-(limit // 2):]


def handoff_prompt(instructions: list[Message], previous: str | None, messages: list[Message],
                   prompt_chars: int) -> list[dict[str, str]]:
    """OpenAI-form chat messages asking for a handoff summary (module docstring).

    ``instructions`` are the user messages up to now, ``messages`` the history condensed now;
    sizes are in characters.
    """
    parts = []
    if instructions:
        parts.append("User instructions:\n" + instructions_text(instructions, prompt_chars // 4))
    if previous:
        parts.append("Previous handoff summary:\n" + previous[:prompt_chars // 2])
    parts.append(("Work since that summary:\n" if previous else "Work so far:\n") + history_text(messages, prompt_chars))
    parts.append("Write the handoff summary now.")
    return [{"role": "system", "content": HANDOFF_INSTRUCTIONS}, {"role": "user", "content": "\n\n".join(parts)}]


@dataclass(frozen=True)
class CodexSummaryConfig:
    """Summary output cap (model tokens) and prompt size (characters of history); module docstring."""

    max_summary_tokens: int = 64
    prompt_chars: int = 2400

    def __post_init__(self) -> None:
        check_summary(self)


@register("codex-summary", "ReCAP §5 Baselines (Codex-style summarization)",
          "Over B, the model writes a handoff summary of the history; every earlier user message stays verbatim "
          "before it. Summariser: the configured model (default local SmolLM2), not the agent's backbone.")
class CodexSummary(CondensingPolicy):
    """ReCAP's Codex-style summarization baseline (module docstring)."""

    Config = CodexSummaryConfig
    keeps_users = True
    summary_header = HANDOFF_HEADER
    prompt_version = HANDOFF_VERSION

    def __init__(self, name: str = "codex-summary", config: CodexSummaryConfig | None = None) -> None:
        super().__init__(name, config)

    def plan(self, view: View, budget: int, graph: ContextGraph) -> int:
        return len(view.units)  # all condensable history (user messages are never units here)

    def condense(self, signals: Signals, previous: str | None, graph: ContextGraph, k: int, positions: list[int],
                 usage: ModelUsage) -> str:
        msgs = graph.messages
        users = [msgs[p] for p in range(k) if msgs[p].role == "user"]
        prompt = handoff_prompt(users, previous, [msgs[p] for p in positions], self.config.prompt_chars)
        return self.summarizer.complete(signals, prompt, usage)
