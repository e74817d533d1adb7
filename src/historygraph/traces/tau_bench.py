"""Reader for τ-bench historical trajectories (``historical_trajectories/*.json``).

Layout of the files as recorded by the tool's public runs. A file is a JSON list of runs ``{task_id, trial, reward,
info{task, reward_info, …}, traj[]}``; ``traj`` is already OpenAI chat form (an assistant
``content`` may be ``null`` when it carries ``tool_calls``). Trace id: ``task{task_id}-trial{trial}``.

Read:
    ``task_id``, ``trial``, ``reward`` (into ``meta``) and per message ``role``, ``content``,
    ``tool_calls`` (``{id, type, function{name, arguments}}``), ``tool_call_id`` and ``name``.
Ignored:
    ``info`` (the task's gold actions/instruction for the user simulator, reward details, user
    cost). The format has no timestamps. The tool schemas are not in the file.
Note:
    the recorded call ids repeat within some runs (the same ``call_…`` id used by two different
    calls); the pairing pass renames the later ones ``id#2`` … and remaps results in order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from historygraph.history.events import Trace

from historygraph.traces._common import Builder, TraceFormatError, load_json, openai_message, req

NAME = "tau-bench"


def sniff(obj: Any) -> bool:
    """A JSON list whose first item is an object with ``traj`` and ``task_id``."""
    return (isinstance(obj, list) and bool(obj) and isinstance(obj[0], dict)
            and "traj" in obj[0] and "task_id" in obj[0])


def read(path: str | Path, obj: Any = None) -> Iterator[Trace]:
    """Yield one trace per run in ``path`` (``obj``: the already parsed JSON, if at hand)."""
    if obj is None:
        obj = load_json(path, NAME)
    if not isinstance(obj, list):
        raise TraceFormatError(path, NAME, "(top level)", f"expected a list, got {type(obj).__name__}")
    for n, run in enumerate(obj):
        where = f"[{n}]"
        task_id = req(run, "task_id", (int, str), where, path=path, fmt=NAME)
        trial = run.get("trial", 0)
        b = Builder(path, NAME, f"task{task_id}-trial{trial}")
        for i, m in enumerate(req(run, "traj", list, where, b)):
            b.add(openai_message(b, m, f"{where}.traj[{i}]"))
        msgs, stats = b.finish()
        meta = {"task_id": task_id, "trial": trial, "reward": run.get("reward"), **stats}
        yield Trace(source=NAME, trace_id=b.trace_id, path=str(path), messages=msgs, meta=meta)
