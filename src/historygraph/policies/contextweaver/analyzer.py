"""The LLM parent analyzer of ContextWeaver's full framework (Appendix F.2, §3.1 "Parent Selection").

The model sees the task, a one-line view of each eligible earlier step (id, the file it read if
any, the action and the start of its output), the latest step (thought, action, output) and the
files in focus (those of the latest thought and the last five actions, newest first), and answers
with a JSON list of 1–3 step ids, most important first, or ``[]``. The prompt wording is ours.

:func:`parse_parent_ids` is deliberately forgiving: it takes the first bracketed list in the
answer that parses as JSON (code fences and prose around it are ignored), keeps integer ids (and
digit strings) that are eligible candidates, drops duplicates and keeps at most ``max_parents``.
An answer with no parsable list returns ``None`` and the caller falls back to the low-cost score;
an explicit ``[]`` means "no parent".

Answers are cached by prompt hash in ``signals.store`` kind ``"parents"`` (and per graph by
:func:`historygraph.signals.steps.view.build_steps`), so each step costs at most one model call.
"""

from __future__ import annotations

import hashlib
import json
import re

from historygraph.history.graph import ContextGraph
from historygraph.signals.steps.features import Step, files_in
from historygraph.signals.steps.parents import Selector
from historygraph.policies.base import Signals

SYSTEM = (
    "You link the steps of a software-engineering agent into a dependency graph. Every step is a node. "
    "Decide which earlier steps the latest step directly relies on: the file contents it edits or reasons "
    "about, the error or test output it reacts to, the search result or definition it uses. Only direct "
    "dependencies: what those steps relied on is reached through their own links. When several steps show "
    "the same part of a file, prefer the most recent one. Answer with a JSON list of one to three step ids, "
    "most important first, for example [9, 4]. Answer [] only when the latest step relies on no earlier step.")
_LIST = re.compile(r"\[[^\[\]]*\]")
PROMPT_VERSION = "cw-parents-1"


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."


def build_prompt(task: str, steps: list[Step], k: int, eligible: list[int], observations: dict[int, str],
                 max_candidates: int = 40) -> list[dict[str, str]]:
    """The analyzer's messages for step ``k``; at most the ``max_candidates`` newest eligible
    candidates are listed (ours, to bound the prompt)."""
    lines = []
    for i in eligible[-max_candidates:]:
        s = steps[i]
        read = sorted(files_in(s.action))
        tag = f"(read {read[0]}) " if read else ""
        lines.append(f"[{i}] {tag}'{_clip(s.action, 120)}' -> '{_clip(observations.get(i, ''), 100)}'")
    cur = steps[k]
    focus: list[str] = []
    for s in [cur] + [steps[i] for i in range(k - 1, max(-1, k - 5), -1)]:
        for f in sorted(files_in(s.thought + "\n" + s.action)):
            if f not in focus:
                focus.append(f)
    user = (f"Task (truncated): {_clip(task, 1500)}\n\nEarlier steps (id, action -> start of output):\n"
            + "\n".join(lines)
            + f"\n\nLatest step {k}:\nthought: {_clip(cur.thought, 600)}\naction: {_clip(cur.action, 300)}\n"
              f"output: {_clip(observations.get(k, ''), 600)}\n\n"
              f"Files in focus (latest thought and last five actions, newest first): {focus}\n\n"
              "Which earlier steps (ids from the list) does the latest step directly rely on? "
              "Reply with the JSON list only.")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def parse_parent_ids(text: str, eligible: list[int], max_parents: int = 3) -> list[int] | None:
    """Parent ids from a model answer (rules in the module docstring); ``None`` if unparsable."""
    allowed = set(eligible)
    for match in _LIST.finditer(text):
        try:
            data = json.loads(match.group(0))
        except ValueError:
            continue
        if not isinstance(data, list):
            continue
        out: list[int] = []
        for x in data:
            if isinstance(x, bool):
                continue
            if isinstance(x, str) and x.strip().isdigit():
                x = int(x)
            if isinstance(x, int) and x in allowed and x not in out:
                out.append(x)
        if out or not data:
            return out[:max_parents]
    return None


def llm_selector(graph: ContextGraph, signals: Signals, fallback: Selector, max_parents: int = 3) -> Selector:
    """A :data:`~historygraph.signals.steps.parents.Selector` that asks ``signals.model`` (F.2) and falls
    back to ``fallback`` when the answer has no usable list."""
    users = [m.content for m in graph.messages if m.role == "user"]
    task = users[0] if users else ""

    def select(steps: list[Step], k: int, eligible: list[int]) -> tuple[int, ...]:
        obs = {i: "\n".join(graph.messages[p].content for p in steps[i].results) for i in eligible + [k]}
        messages = build_prompt(task, steps, k, eligible, obs)
        model = signals.model
        key = hashlib.sha256("\x00".join([PROMPT_VERSION, model.name] + [m["content"] for m in messages]).encode()).hexdigest()
        store = signals.store
        answer = store.get_text("parents", key) if store is not None else None
        if answer is None:
            answer = model.complete(messages, max_tokens=24).text
            if store is not None:
                store.put_text("parents", key, answer)
        ids = parse_parent_ids(answer, eligible, max_parents)
        return tuple(ids) if ids is not None else fallback(steps, k, eligible)

    return select
