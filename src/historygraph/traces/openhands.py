"""Reader for OpenHands event histories: ``output.jsonl`` and bare event-list JSON.

Layout of the files as recorded by the tool's public runs. An ``output.jsonl`` line is one run ``{instance_id | issue,
instruction, metadata, history[], metrics, error, test_result, instance}``; a ``.json`` file may
also be a bare list of events (``basic_gui_mode.json``; trace id = file stem). The trace id of a
line is ``instance_id``, else ``issue-{issue.number}``, else ``{stem}-line{n}``.

Read (event format with ``id/source``):
    ``action`` events: ``system`` → system message (``args.content``; the tool names of
    ``args.tools`` go to ``meta["tools"]``); ``message`` → user message (``source: user``) or plain
    assistant message (``source: agent``); an agent action with ``tool_call_metadata`` → an
    assistant message whose content is ``args.thought`` with one call (id =
    ``tool_call_id``, name = ``function_name``, arguments = ``args`` as JSON minus the fields in
    ``_NOT_ARGUMENTS``, ``None`` values, empty ``{}``/``[]`` and ``is_input: false``; for
    ``impl_source: oh_aci`` the editor leftovers ``content``/``start``/``end`` are dropped too, and
    an edit without ``command`` takes its arguments from the ``file_editor(**{…})`` literal in
    ``translated_ipython_code``; a ``think`` call keeps its ``thought`` argument). Actions of one model response (same
    ``model_response.id``, ``total_calls_in_response`` > 1) share ONE assistant message.
    ``observation`` events: linked to their action by ``cause`` (fallback:
    ``tool_call_metadata.tool_call_id``) → ``role: tool`` result with ``content`` (for ``run``,
    wrapped in ``extras.metadata.prefix``/``suffix`` as OpenHands shows it to the model).
    An ``error`` observation without a cause (a malformed call OpenHands rejected before it became
    an action) is shown to the model as a user message, and is kept as one
    (``meta["error_observations"]``).
    Timestamps: ISO strings, naive ones taken as UTC.
Recall: the ``recall`` action (the environment's microagent/workspace lookup) is not
    model-visible and is skipped; its ``recall`` observation IS shown to the model (OpenHands
    renders repository info, runtime hosts, date, extra instructions and triggered microagent
    knowledge into a user message) and becomes a user message built from those ``extras`` fields,
    prefixed ``[recalled context]`` (an approximation: OpenHands' templates are not in the file);
    counted in ``meta["recall_messages"]``; skipped when every field is empty.
Older resolver format (2024: no ``id``/``source``, flattened fields): ``message`` → user message
    before the first agent action, assistant message after it; ``finish`` → plain assistant message
    (its ``thought``); any other action → an assistant message (``thought``) with a synthetic call
    ``{trace_id}-call-{k}`` named after the action (``run`` → ``execute_bash``, ``run_ipython`` →
    ``execute_ipython_cell``, else the action name), arguments = the flattened fields minus
    ``_NOT_ARGUMENTS``; each observation answers the latest unanswered call.
OpenDevin pairs (2024 ``output.jsonl``): ``history`` is a list of ``[action, observation]`` pairs
    (OpenDevin's ``(action.to_dict(), observation.to_dict())``). The pairs are flattened to the
    event list above: an action without ``id`` gets ``pair-{k}`` and its observation, when it
    has no ``cause``, is linked to it; an action without ``source`` is an agent action, except a
    ``message`` before the first agent action (the user's). When no user message is in the
    history, ``instruction`` becomes the first user message (OpenDevin kept the task only there).
    Counted in ``meta["event_format"] = "pairs"``.
Ignored: ``tool_call_metadata.model_response`` (raw LLM response; only its ``id`` is used for
    grouping), ``llm_metrics``, ``metrics``, ``message`` of actions (an auto-generated summary),
    ``agent_state_changed``/``change_agent_state``/``null`` events, ``instance``, ``test_result``,
    ``instruction`` (repeats the first user message).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, Iterator

from historygraph.history.events import ToolCall, Trace

from historygraph.traces._common import (Builder, Draft, TraceFormatError, dig, dumps, epoch, iter_jsonl, lines_error,
                                          load_json, req, text)

NAME = "openhands"

# Action fields that are bookkeeping or shown elsewhere, not arguments the model produced.
_NOT_ARGUMENTS = frozenset({
    "thought", "blocking", "hidden", "confirmation_state", "is_static", "cwd", "impl_source",
    "translated_ipython_code", "security_risk", "kernel_init_code", "is_confirmed", "action_risk",
    "keep_prompt", "images_urls", "image_urls", "wait_for_response", "action",
})
_SKIP_ACTIONS = frozenset({"recall", "change_agent_state", "null"})
_SKIP_OBSERVATIONS = frozenset({"null", "agent_state_changed", "change_agent_state"})
_PLAIN_ACTIONS = frozenset({"finish", "reject", "message"})  # old format: no tool call
_FILE_EDITOR = re.compile(r"print\(file_editor\(\*\*(\{.*\})\)\)", re.DOTALL)
_OLD_NAMES = {"run": "execute_bash", "run_ipython": "execute_ipython_cell"}


def _is_event(e: Any) -> bool:
    return isinstance(e, dict) and ("action" in e or "observation" in e)


def _kind(b: Builder, e: Any, w: str) -> tuple[bool, str]:
    """``(is_action, name)`` of an event; TraceFormatError unless it is a well-formed event."""
    if not _is_event(e):
        raise b.err(w, "expected an event object with 'action' or 'observation'")
    key = "action" if "action" in e else "observation"
    if not isinstance(e[key], str):
        raise b.err(f"{w}.{key}", f"expected str, got {type(e[key]).__name__}")
    return key == "action", e[key]


def _key(x: Any) -> Any:
    """An event id / cause usable as a dict key (``None`` for anything else)."""
    return x if isinstance(x, (int, str)) and not isinstance(x, bool) else None


def _is_pair(e: Any) -> bool:
    """An OpenDevin ``[action, observation]`` history entry."""
    return isinstance(e, list) and 1 <= len(e) <= 2 and _is_event(e[0])


def sniff(obj: Any) -> bool:
    """A run record (object with an event list, or a list of ``[action, observation]`` pairs,
    ``history`` and ``instance_id``/``issue``/``instruction``, no ``trajectory``) or a bare list of events."""
    if isinstance(obj, dict):
        h = obj.get("history")
        return (isinstance(h, list) and "trajectory" not in obj
                and bool({"instance_id", "issue", "instruction"} & obj.keys())
                and (not h or _is_event(h[0]) or _is_pair(h[0])))
    return isinstance(obj, list) and bool(obj) and all(_is_event(e) for e in obj[:5])


def read(path: str | Path, obj: Any = None) -> Iterator[Trace]:
    """Yield one trace per JSONL line, or the one trace of a bare-list/record JSON file. A JSONL
    line that cannot be read is skipped; once the others are yielded, one TraceFormatError names
    every such line."""
    path = Path(path)
    if obj is None and path.suffix == ".jsonl":
        errors: list[TraceFormatError] = []
        read = 0
        for n, rec in iter_jsonl(path, NAME, errors):
            try:
                trace = _record(path, rec, f"line {n}", f"{path.stem}-line{n}")
            except TraceFormatError as e:
                errors.append(e)
                continue
            read += 1
            yield trace
        if errors:
            raise lines_error(errors, read)  # in file order: a line's error is added before the next line is read
        return
    if obj is None:
        obj = load_json(path, NAME)
    if isinstance(obj, list):
        yield _trace(path, path.stem, obj, "")
    elif isinstance(obj, dict):
        yield _record(path, obj, "", path.stem)
    else:
        raise TraceFormatError(path, NAME, "(top level)", f"expected a list or an object, got {type(obj).__name__}")


def _record(path: Path, rec: Any, where: str, fallback_id: str) -> Trace:
    if not isinstance(rec, dict):
        raise TraceFormatError(path, NAME, where or "(top level)", f"expected an object, got {type(rec).__name__}")
    if rec.get("instance_id") is not None:
        trace_id = str(rec["instance_id"])
    elif dig(rec, "issue", "number") is not None:
        trace_id = f"issue-{rec['issue']['number']}"
    else:
        trace_id = fallback_id
    history = req(rec, "history", list, where, path=path, fmt=NAME)
    meta = {"instance_id": rec.get("instance_id"), "model": dig(rec, "metadata", "llm_config", "model"),
            "agent_class": dig(rec, "metadata", "agent_class"), "error": rec.get("error")}
    if isinstance(rec.get("issue"), dict):
        meta.update(issue=f"{rec['issue'].get('owner')}/{rec['issue'].get('repo')}#{rec['issue'].get('number')}",
                    success=rec.get("success"))
    hwhere = f"{where}.history" if where else "history"
    if history and all(isinstance(e, list) for e in history):
        history = _unpair(path, history, hwhere, rec.get("instruction"))
        meta["event_format"] = "pairs"
    return _trace(path, trace_id, history, hwhere, meta)


def _unpair(path: Path, pairs: list, where: str, instruction: Any) -> list:
    """The event list of an OpenDevin pair history (module docstring, "OpenDevin pairs")."""
    events: list[dict] = []
    agent_seen = False
    for k, pair in enumerate(pairs):
        if not _is_pair(pair):
            raise TraceFormatError(path, NAME, f"{where}[{k}]", "expected an [action, observation] pair")
        action = dict(pair[0])
        if "action" in action:
            if action.get("id") is None:
                action["id"] = f"pair-{k}"
            if action.get("source") is None:
                user = action["action"] == "message" and not agent_seen
                action["source"] = "user" if user else "agent"
            agent_seen = agent_seen or action["source"] == "agent"
        events.append(action)
        if len(pair) == 2:
            if not _is_event(pair[1]):
                raise TraceFormatError(path, NAME, f"{where}[{k}][1]", "expected an observation object")
            obs = dict(pair[1])
            if obs.get("cause") is None and "action" in action:
                obs["cause"] = action["id"]
            events.append(obs)
    has_user = any(e.get("action") == "message" and e.get("source") == "user" for e in events)
    if not has_user and isinstance(instruction, str) and instruction.strip():
        events.insert(0, {"action": "message", "source": "user", "args": {"content": instruction}})
    return events


def _trace(path: Path, trace_id: str, events: list, where: str, meta: dict | None = None) -> Trace:
    b = Builder(path, NAME, trace_id)
    old = bool(events) and not any(isinstance(e, dict) and {"source", "args", "extras", "id"} & e.keys()
                                   for e in events)
    counts = (_old if old else _new)(b, events, where or "")
    msgs, stats = b.finish()
    meta = {"event_format": "old" if old else "event", **(meta or {}), **counts, **stats}
    return Trace(source=NAME, trace_id=trace_id, path=str(path), messages=msgs, meta=meta)


def _arguments(args: dict, keep_thought: bool = False) -> str:
    if args.get("impl_source") == "oh_aci" and "command" not in args:
        recovered = _editor_call(args.get("translated_ipython_code"))
        if recovered is not None:
            return dumps(recovered)
    drop = _NOT_ARGUMENTS | ({"content", "start", "end"} if args.get("impl_source") == "oh_aci" else set())
    if keep_thought:
        drop = drop - {"thought"}
    return dumps({k: v for k, v in args.items()
                  if k not in drop and v is not None and v != {} and v != [] and not (k == "is_input" and v is False)})


def _editor_call(code: Any) -> dict | None:
    """The keyword dict of ``print(file_editor(**{...}))`` (early 2025 ``oh_aci`` edits keep the
    model's str_replace_editor arguments only there), parsed as a literal; ``None`` otherwise."""
    if not isinstance(code, str):
        return None
    m = _FILE_EDITOR.match(code.strip())
    if not m:
        return None
    try:
        value = ast.literal_eval(m.group(1))
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, dict) else None


def _new(b: Builder, events: list, where: str) -> dict:
    # (over 80 lines: one pass over the event list; the pending calls, parallel-call groups and counts tie its branches together)
    calls_of: dict[Any, str] = {}  # action event id -> call id
    groups: dict[str, Draft] = {}  # model_response id -> assistant message holding parallel calls
    counts: dict[str, Any] = {"recall_messages": 0, "error_observations": 0}  # (and "tools": names)
    k = 0
    for i, e in enumerate(events):
        w = f"{where}[{i}]"
        is_action, kind = _kind(b, e, w)
        ts = epoch(e.get("timestamp"))
        tcm = e.get("tool_call_metadata") if isinstance(e.get("tool_call_metadata"), dict) else None
        if is_action:
            act, src = kind, e.get("source")
            args = e.get("args") if e.get("args") is not None else {}
            if not isinstance(args, dict):
                raise b.err(f"{w}.args", f"expected an object, got {type(args).__name__}")
            if act in _SKIP_ACTIONS:
                continue
            if act == "system":
                body = text(b, args.get("content", e.get("message")), f"{w}.args.content")
                b.add(Draft("system", body, timestamp=ts, where=w))
                tools = got if isinstance(got := args.get("tools"), list) else []
                counts["tools"] = [n for n in (dig(t, "function", "name") for t in tools) if isinstance(n, str)]
            elif act == "message" and tcm is None:
                role = "user" if src in ("user", "environment") else "assistant"
                body = text(b, args.get("content", e.get("message")), f"{w}.args.content")
                b.add(Draft(role, body, timestamp=ts, where=w))
            elif src != "agent" and tcm is None:
                continue  # user-initiated commands etc.: not part of the model's conversation here
            elif tcm is None and act in _PLAIN_ACTIONS:
                body = args.get("final_thought") or args.get("thought") or args.get("content") or ""
                b.add(Draft("assistant", text(b, body, f"{w}.args"), timestamp=ts, where=w))
            else:
                if tcm is not None:
                    cid = str(req(tcm, "tool_call_id", (str, int), f"{w}.tool_call_metadata", b))
                    fname = str(req(tcm, "function_name", str, f"{w}.tool_call_metadata", b))
                else:
                    k += 1
                    cid, fname = f"{b.trace_id}-call-{k}", _OLD_NAMES.get(act, act)
                think = act == "think"
                call = ToolCall(cid, fname, _arguments(args, keep_thought=think))
                body = "" if think else text(b, args.get("thought"), f"{w}.args.thought")
                rid = _key(dig(tcm, "model_response", "id"))
                total = (tcm or {}).get("total_calls_in_response") or 1
                if isinstance(total, int) and total > 1 and rid and rid in groups:
                    d = groups[rid]
                    d.calls.append(call)
                    if body:
                        d.content = f"{d.content}\n{body}" if d.content else body
                else:
                    d = b.add(Draft("assistant", body, [call], timestamp=ts, where=w))
                    if isinstance(total, int) and total > 1 and rid:
                        groups[rid] = d
                if _key(e.get("id")) is not None:
                    calls_of[_key(e.get("id"))] = cid
        else:
            obs = kind
            if obs in _SKIP_OBSERVATIONS:
                continue
            extras = got if isinstance(got := e.get("extras"), dict) else {}
            if obs == "recall":
                body = _recall_text(extras)
                if body:
                    counts["recall_messages"] += 1
                    b.add(Draft("user", "[recalled context]\n" + body, timestamp=ts, where=w))
                continue
            body = text(b, e.get("content"), f"{w}.content")
            if obs == "run":
                md = got if isinstance(got := extras.get("metadata"), dict) else {}
                body = f"{md.get('prefix') or ''}{body}{md.get('suffix') or ''}"
            cause = _key(e.get("cause"))
            call_id = calls_of.get(cause) if cause is not None else None
            if call_id is None and tcm is not None and tcm.get("tool_call_id"):
                call_id = str(tcm["tool_call_id"])
            if call_id is not None:
                b.add(Draft("tool", body, tool_call_id=call_id, name=dig(tcm, "function_name"), timestamp=ts, where=w))
            elif cause is None and obs == "error":
                counts["error_observations"] += 1
                b.add(Draft("user", body, timestamp=ts, where=w))
            else:
                b.orphan(body, ts, w)
    return counts


def _old(b: Builder, events: list, where: str) -> dict:
    k, last_call, seen_agent = 0, None, False
    for i, e in enumerate(events):
        w = f"{where}[{i}]"
        is_action, act = _kind(b, e, w)
        if is_action:
            if act in _SKIP_ACTIONS:
                continue
            if act == "message":
                b.add(Draft("assistant" if seen_agent else "user", text(b, e.get("content"), f"{w}.content"), where=w))
                continue
            seen_agent = True
            body = text(b, e.get("thought"), f"{w}.thought")
            if act in _PLAIN_ACTIONS:
                b.add(Draft("assistant", body, where=w))
                last_call = None
                continue
            k += 1
            last_call = f"{b.trace_id}-call-{k}"
            b.add(Draft("assistant", body, [ToolCall(last_call, _OLD_NAMES.get(act, act), _arguments(e))], where=w))
        else:
            if act in _SKIP_OBSERVATIONS:
                continue
            body = text(b, e.get("content"), f"{w}.content")
            if last_call is not None:
                b.add(Draft("tool", body, tool_call_id=last_call, where=w))
                last_call = None
            else:
                b.orphan(body, where=w)
    return {}


def _recall_text(extras: dict) -> str:
    parts: list[str] = []
    if extras.get("repo_name") or extras.get("repo_directory"):
        parts.append(f"Repository: {extras.get('repo_name') or ''} at {extras.get('repo_directory') or ''}".strip())
    for key, label in (("repo_instructions", "Repository instructions"),
                       ("additional_agent_instructions", "Additional instructions")):
        if isinstance(extras.get(key), str) and extras[key].strip():
            parts.append(f"{label}:\n{extras[key]}")
    hosts = extras.get("runtime_hosts")
    if isinstance(hosts, (dict, list)) and hosts:
        parts.append("Runtime hosts: " + ", ".join(str(h) for h in hosts))
    if extras.get("date"):
        parts.append(f"Today's date: {extras['date']}")
    knowledge = extras.get("microagent_knowledge")
    for mk in knowledge if isinstance(knowledge, list) else []:
        if isinstance(mk, dict) and mk.get("content"):
            parts.append(f"Microagent {mk.get('name')!s} (triggered by {mk.get('trigger')!r}):\n{mk['content']}")
    return "\n\n".join(parts)
