"""Scripted answers of the fake provider (``tests/fake_upstream.py``): a model named ``script-<N>``
makes a real agent program do ``N`` steps of real work and then finish, so the ``clients`` tests
(tests/clients/) can drive Claude Code, mini-swe-agent, aider and the frameworks through the proxy.
A test double: it lives with the tests.

The answer is derived from the request alone (no state in the fake), so it holds whatever the
proxy left out of the history: step ``k`` is one more than the largest step marker in the request's
assistant turns (``STEP-<k>`` in a command, ``hgs<k>_`` in a call id), so the newest step, which
the proxy must always forward, decides it.

* With tools offered, step ``k <= N`` calls the client's shell tool (a tool named like ``bash``,
  ``shell``, ``exec_command``; else the first tool), its arguments filled from the tool's JSON
  schema with :func:`command` (``echo STEP-<k>`` and 181 numbers: about 450 tokens of output,
  :func:`expected_output`). Step ``N + 1`` finishes: the agent's own submit command when its
  prompt names one (mini-swe-agent's ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``), or its
  ``final_answer`` tool when it offers one (smolagents), else a text.
* ``script-<N>-load`` (Claude Code's deferred tools): step 1 calls ``ToolSearch`` with
  ``select:CronList``, step 2 calls the loaded ``CronList``, then ``N`` steps as above (steps 3
  to ``N + 2``).
* Without tools, step ``k <= N`` answers in the client's text protocol: a ``mswea_bash_command``
  block for mini-swe-agent's text mode, a SEARCH/REPLACE edit of ``notes.txt`` (``v<k-1>`` to
  ``v<k>``) for aider, else a text.
"""

from __future__ import annotations

import json
import re
from typing import Any

SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # mini-swe-agent's finishing command output
SHELLS = ("bash", "shell", "exec_command", "execute_bash", "run_shell", "run_command", "terminal", "local_shell",
          "run_shell_command")
MARK = re.compile(r"(?:STEP-|hgs)(\d+)")


def script_of(model: Any) -> tuple[int, bool] | None:
    """``(N, load)`` for a model name ``script-<N>[-load]``, else ``None`` (not scripted)."""
    m = re.fullmatch(r"(?:[\w.-]+/)?script-(\d+)(-load)?", str(model or ""))
    return (int(m.group(1)), bool(m.group(2))) if m else None


def command(k: int) -> str:
    """The shell command of step ``k``: its output is :func:`expected_output`."""
    return f"echo STEP-{k}; seq -s ' ' {k * 10000} {k * 10000 + 180}"


def expected_output(k: int) -> str:
    """What :func:`command` ``(k)`` prints (the numbers line without its newline)."""
    return f"STEP-{k}\n" + " ".join(str(x) for x in range(k * 10000, k * 10000 + 181))


def _tools(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, JSON schema) of each tool offered, in the three wire formats (a deferred tool too:
    Claude Code offers a loaded one with ``defer_loading`` still set)."""
    out = []
    for t in body.get("tools") or []:
        if not isinstance(t, dict):
            continue
        f = t.get("function") if isinstance(t.get("function"), dict) else t
        schema = f.get("parameters") or f.get("input_schema") or {}
        if f.get("name"):
            out.append((f["name"], schema))
    return out


def _args(schema: dict[str, Any], cmd: str) -> dict[str, Any]:
    """Arguments for a shell-like tool: the command in each required (or command-named) string
    field, a plain value of its type (an enum's first) in the others."""
    props = schema.get("properties") or {}
    names = list(schema.get("required") or []) + [n for n in ("command", "cmd") if n in props]
    if not names:
        names = [n for n, p in props.items() if isinstance(p, dict) and p.get("type") == "string"][:1]
    kinds = {"string": cmd, "array": ["bash", "-lc", cmd], "integer": 60000, "number": 60000, "boolean": False, "object": {}}
    fill = lambda p: p["enum"][0] if p.get("enum") else kinds.get(p.get("type", "string"), cmd)  # an enum: its first value
    return {n: fill(props.get(n) or {}) for n in dict.fromkeys(names)}


def _turns(body: dict[str, Any]) -> list[dict[str, Any]]:
    items = body.get("messages") if "messages" in body else body.get("input")
    return [m for m in items if isinstance(m, dict)] if isinstance(items, list) else []


def step(body: dict[str, Any]) -> int:
    """The step the request is at: one more than the largest marker in its assistant turns."""
    done = [int(x) for m in _turns(body) if m.get("role") == "assistant" or m.get("type") in ("function_call", "custom_tool_call")
            for x in MARK.findall(json.dumps(m))]
    return max(done, default=0) + 1


def action(body: dict[str, Any], n: int) -> dict[str, Any]:
    """What the scripted model does next: ``{"text": ...}`` or ``{"call": {"id", "name", "args"}}``
    (``n``: the fake's request count, which keeps call ids unique)."""
    steps, load = script_of(body.get("model")) or (0, False)
    k, text = step(body), json.dumps(body)
    last = steps + 2 if load else steps  # the load's two steps come first
    tools = dict(_tools(body))
    if tools:
        shell = next((t for t in tools if t.lower() in SHELLS), next((t for t in tools if "bash" in t.lower()), next(iter(tools))))
        call = lambda name, args: {"call": {"id": f"hgs{k}_{n}", "name": name, "args": args}}
        if load and k == 1 and "ToolSearch" in tools:
            return call("ToolSearch", {"query": "select:CronList", "max_results": 1})
        if load and k == 2 and "CronList" in tools:
            return call("CronList", {})
        if k <= last:
            return call(shell, _args(tools[shell], command(k)))
        if k == last + 1 and SUBMIT in text:
            return call(shell, _args(tools[shell], f"echo {SUBMIT}"))
        if k == last + 1 and "final_answer" in tools:  # smolagents: a run ends with its final_answer tool
            return call("final_answer", {"answer": f"Done: {steps} steps."})
        return {"text": f"Done: {steps} steps."}
    if "mswea_bash_command" in text and k <= steps + 1:
        cmd = command(k) if k <= steps else f"echo {SUBMIT}"
        return {"text": f"THOUGHT: step STEP-{k}.\n\n```mswea_bash_command\n{cmd}\n```"}
    if "SEARCH/REPLACE" in text and k <= steps:
        return {"text": f"Step STEP-{k}: bump the version.\n\nnotes.txt\n```\n<<<<<<< SEARCH\nv{k - 1}\n=======\nv{k}\n>>>>>>> REPLACE\n```\n"}
    return {"text": f"Done: {steps} steps."}


def sse(kind: str | None, data: dict[str, Any]) -> str:
    return (f"event: {kind}\n" if kind else "") + "data: " + json.dumps(data) + "\n\n"


def openai_reply(body: dict[str, Any], n: int) -> dict[str, Any] | list[str]:
    """The scripted Chat Completions answer: a completion, or its SSE events when streamed."""
    act = action(body, n)
    base = {"id": f"chatcmpl-s{n}", "created": 0, "model": body.get("model")}
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    call = act.get("call")
    tc = {"id": f"call_{call['id']}", "type": "function", "function": {"name": call["name"], "arguments": json.dumps(call["args"])}} if call else None
    finish = "tool_calls" if call else "stop"
    if not body.get("stream"):
        msg = {"role": "assistant", "content": act.get("text"), **({"tool_calls": [tc]} if tc else {})}
        return {**base, "object": "chat.completion", "choices": [{"index": 0, "message": msg, "finish_reason": finish}], "usage": usage}
    chunk = lambda delta, fin=None: sse(None, {**base, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": fin}]})
    events = [chunk({"role": "assistant", "content": "" if act.get("text") else None})]
    if tc:
        events.append(chunk({"tool_calls": [{"index": 0, **tc}]}))
    else:
        events += [chunk({"content": act["text"][i:i + 40]}) for i in range(0, len(act["text"]), 40)]
    events.append(chunk({}, finish))
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append(sse(None, {**base, "object": "chat.completion.chunk", "choices": [], "usage": usage}))
    return events + ["data: [DONE]\n\n"]


def anthropic_reply(body: dict[str, Any], n: int, sign: Any) -> dict[str, Any] | list[str]:
    """The scripted Messages answer (a signed thinking block first), or its SSE events."""
    act = action(body, n)
    think = f"thinking {n}"
    blocks: list[dict[str, Any]] = [{"type": "thinking", "thinking": think, "signature": sign(think)}]
    if act.get("call"):
        c = act["call"]
        blocks.append({"type": "tool_use", "id": f"toolu_{c['id']}", "name": c["name"], "input": c["args"]})
    else:
        blocks.append({"type": "text", "text": act["text"]})
    stop = "tool_use" if act.get("call") else "end_turn"
    msg = {"id": f"msg_s{n}", "type": "message", "role": "assistant", "model": body.get("model"), "stop_sequence": None,
           "usage": {"input_tokens": 1, "output_tokens": 1}}
    if not body.get("stream"):
        return {**msg, "content": blocks, "stop_reason": stop}
    events = [sse("message_start", {"type": "message_start", "message": {**msg, "content": [], "stop_reason": None}})]
    for i, b in enumerate(blocks):
        if b["type"] == "thinking":
            start, deltas = {"type": "thinking", "thinking": ""}, [{"type": "thinking_delta", "thinking": b["thinking"]},
                                                                   {"type": "signature_delta", "signature": b["signature"]}]
        elif b["type"] == "tool_use":
            start, deltas = {**b, "input": {}}, [{"type": "input_json_delta", "partial_json": json.dumps(b["input"])}]
        else:
            start, deltas = {"type": "text", "text": ""}, [{"type": "text_delta", "text": b["text"]}]
        events.append(sse("content_block_start", {"type": "content_block_start", "index": i, "content_block": start}))
        events += [sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d}) for d in deltas]
        events.append(sse("content_block_stop", {"type": "content_block_stop", "index": i}))
    events.append(sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                        "usage": {"output_tokens": 1}}))
    return events + [sse("message_stop", {"type": "message_stop"})]


def responses_output(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """The scripted Responses API output items (for a ``/v1/responses`` route of the fake): a
    ``function_call`` (arguments a JSON string) or an assistant ``message``."""
    act = action(body, n)
    if act.get("call"):
        c = act["call"]
        return [{"type": "function_call", "id": f"fc_s{n}", "call_id": f"call_{c['id']}", "name": c["name"],
                 "arguments": json.dumps(c["args"]), "status": "completed"}]
    return [{"type": "message", "id": f"msg_s{n}", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": act["text"], "annotations": []}]}]
