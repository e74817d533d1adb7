"""Reader for mini-swe-agent trajectories (``trajectory_format: "mini-swe-agent-1.1"``).

Layout of the files as recorded by the tool's public runs. One file holds one trajectory: ``{trajectory_format,
instance_id, info{…}, messages[]}``; ``messages`` is already OpenAI chat form.

Read:
    ``instance_id`` (trace id); per message ``role``, ``content``, ``tool_calls``,
    ``tool_call_id`` and ``extra.timestamp`` (epoch seconds); ``info.exit_status``,
    ``info.mini_version``, ``info.config.model.model_name`` into ``meta``.
Ignored:
    the final ``role: exit`` message (it repeats the submission, the model never saw it);
    ``extra.response`` (raw API response), ``extra.raw_output``, ``extra.actions``, ``extra.cost``,
    ``function_call``, ``provider_specific_fields``, ``reasoning_content`` (deepseek-reasoner
    thinking; events.Message has no field for it), ``info.model_stats`` (costs) and
    ``info.submission``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from historygraph.history.events import Trace

from historygraph.traces._common import Builder, TraceFormatError, dig, epoch, load_json, openai_message, req

NAME = "mini-swe-agent"


def sniff(obj: Any) -> bool:
    """A JSON object whose ``trajectory_format`` starts with ``mini-swe-agent``, or that has
    ``messages`` and ``info.mini_version``."""
    if not isinstance(obj, dict):
        return False
    if str(obj.get("trajectory_format", "")).startswith("mini-swe-agent"):
        return True
    info = obj.get("info")
    return isinstance(obj.get("messages"), list) and isinstance(info, dict) and "mini_version" in info


def read(path: str | Path, obj: Any = None) -> Iterator[Trace]:
    """Yield the one trajectory in ``path`` (``obj``: the already parsed JSON, if at hand)."""
    if obj is None:
        obj = load_json(path, NAME)
    if not isinstance(obj, dict):
        raise TraceFormatError(path, NAME, "(top level)", f"expected an object, got {type(obj).__name__}")
    trace_id = str(req(obj, "instance_id", (str, int), "", path=path, fmt=NAME))
    b = Builder(path, NAME, trace_id)
    messages = req(obj, "messages", list, "", b)
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if isinstance(m, dict) and m.get("role") == "exit":
            continue
        d = openai_message(b, m, where)
        d.timestamp = epoch(dig(m, "extra", "timestamp"))
        b.add(d)
    msgs, stats = b.finish()
    meta = {"model": dig(obj, "info", "config", "model", "model_name"),
            "exit_status": dig(obj, "info", "exit_status"), "mini_version": dig(obj, "info", "mini_version"),
            "trajectory_format": obj.get("trajectory_format"), **stats}
    yield Trace(source=NAME, trace_id=trace_id, path=str(path), messages=msgs, meta=meta)
