"""Reader for τ²-bench simulation results (``results/*.json``).

Layout of the files as recorded by the tool's public runs. A file is ``{timestamp, info{agent_info, environment_info{policy,
…}, …}, tasks[], simulations[]}`` (a bare list of simulations is accepted too). Each simulation
``{id, task_id, trial, termination_reason, reward_info, messages[], …}`` is one trace; the trace id
is the simulation ``id`` (else ``task{task_id}-trial{trial}``, else ``simulation{n}-trial{trial}``).
Only ``messages`` is required: leaderboard submissions carry simulations without ``task_id``
(then ``task.id`` is used when present, else ``meta["task_id"]`` is ``None``).

Read:
    per message ``role``, ``content``, ``tool_calls`` (flat ``{id, name, arguments (dict),
    requestor}``; arguments re-serialised as JSON text), a tool message's ``id`` (= the call id),
    ``requestor`` and ``timestamp`` (ISO, naive taken as UTC); ``info.environment_info.policy``
    becomes the leading system message (the agent's system prompt embeds the domain policy; the
    file has no system message and τ²'s wrapper template is not in it), ``task_id``, ``trial``,
    ``reward_info.reward``, ``termination_reason``, ``info.agent_info.llm`` and the domain into ``meta``.
Ignored:
    ``raw_data`` (raw API response), ``cost``, ``usage``, ``turn_idx``, ``errors``/``error``
    flags, ``reasoning`` (null here), ``tasks[]`` and the rest of ``info``.
User-simulator tools (``requestor: "user"``, telecom domains): the agent never sees them, so
    their calls are dropped from the user message (its text is kept; a user message left empty is
    skipped) and their ``role: tool`` results are skipped; counted in ``meta["user_tool_calls"]``
    and ``meta["user_tool_results"]``. The two development files contain none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from historygraph.history.events import Trace

from historygraph.traces._common import Builder, Draft, TraceFormatError, dig, epoch, load_json, req, text, tool_call

NAME = "tau2-bench"


def _is_sim(x: Any) -> bool:
    return isinstance(x, dict) and isinstance(x.get("messages"), list) and bool(
        {"task_id", "trial", "termination_reason", "reward_info"} & x.keys())


def sniff(obj: Any) -> bool:
    """An object with a ``simulations`` list, or a bare list of simulations (``messages`` + ``task_id``)."""
    if isinstance(obj, dict):
        return isinstance(obj.get("simulations"), list)
    return isinstance(obj, list) and bool(obj) and _is_sim(obj[0])


def read(path: str | Path, obj: Any = None) -> Iterator[Trace]:
    """Yield one trace per simulation in ``path`` (``obj``: the already parsed JSON, if at hand)."""
    if obj is None:
        obj = load_json(path, NAME)
    if isinstance(obj, dict):
        sims, where = req(obj, "simulations", list, "", path=path, fmt=NAME), "simulations"
        policy, info = dig(obj, "info", "environment_info", "policy"), obj.get("info")
    elif isinstance(obj, list):
        sims, where, policy, info = obj, "", None, None
    else:
        raise TraceFormatError(path, NAME, "(top level)", f"expected an object or a list, got {type(obj).__name__}")
    for n, sim in enumerate(sims):
        w0 = f"{where}[{n}]"
        if not isinstance(sim, dict):
            raise TraceFormatError(path, NAME, w0, f"expected an object, got {type(sim).__name__}")
        task_id = sim.get("task_id", dig(sim, "task", "id"))  # leaderboard submissions may omit it
        if task_id is not None and not isinstance(task_id, (str, int)):
            raise TraceFormatError(path, NAME, f"{w0}.task_id", f"expected str or int, got {type(task_id).__name__}")
        trace_id = str(sim.get("id") or (f"task{task_id}-trial{sim.get('trial', 0)}" if task_id is not None
                                         else f"simulation{n}-trial{sim.get('trial', 0)}"))
        b = Builder(path, NAME, trace_id)
        if isinstance(policy, str) and policy:
            b.add(Draft("system", policy, where="info.environment_info.policy"))
        user_calls = user_results = 0
        for i, m in enumerate(req(sim, "messages", list, w0, b)):
            w = f"{w0}.messages[{i}]"
            role = req(m, "role", str, w, b)
            d = Draft(role, text(b, m.get("content"), f"{w}.content"), timestamp=epoch(m.get("timestamp")), where=w)
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list):
                raise b.err(f"{w}.tool_calls", f"expected a list, got {type(calls).__name__}")
            if role == "assistant":
                d.calls = [tool_call(b, c, f"{w}.tool_calls[{k}]") for k, c in enumerate(calls)]
            elif role == "user":
                user_calls += len(calls)
                if calls and not d.content:
                    continue
            elif role == "tool":
                if m.get("requestor") == "user":
                    user_results += 1
                    continue
                d.tool_call_id = str(req(m, "id", (str, int), w, b))
            elif role != "system":
                raise b.err(f"{w}.role", f"unknown role {role!r}")
            b.add(d)
        msgs, stats = b.finish()
        meta = {"task_id": task_id, "trial": sim.get("trial"), "reward": dig(sim, "reward_info", "reward"),
                "termination_reason": sim.get("termination_reason"), "model": dig(info, "agent_info", "llm"),
                "domain": dig(info, "environment_info", "domain_name"), "user_tool_calls": user_calls,
                "user_tool_results": user_results, **stats}
        yield Trace(source=NAME, trace_id=trace_id, path=str(path), messages=msgs, meta=meta)
