"""The Codex CLI session-log reader (historygraph.traces.codex): hand-made excerpts modelled on real
rollout lines, one per rule of the module docstring, then the ten real sessions of
shared/sessions/codex (counts checked against SOURCES.md and against the raw lines)."""

from __future__ import annotations

import base64
import gzip
import json
import struct
from collections import Counter
from pathlib import Path

import pytest

from historygraph.history.events import Message
from historygraph.signals.media import media_tokens
from historygraph.traces import READERS, TraceFormatError, codex, detect_format, read_traces
from historygraph.traces._common import epoch

# ----------------------------------------------------------------------------- excerpt builders

_clock = iter(range(10**6))


def _ts() -> str:
    s = next(_clock)
    return f"2026-06-18T01:{s // 60 % 60:02d}:{s % 60:02d}.000Z"


def line(kind: str, payload: dict, ts: str | None = None) -> dict:
    return {"timestamp": ts or _ts(), "type": kind, "payload": payload}


def session(sid: str = "019ed836-b1da-78f1-8a0c-e598363d10f4", base: str = "You are Codex, a coding agent.") -> dict:
    return line("session_meta", {"id": sid, "timestamp": "2026-06-18T00:52:03.755Z", "cwd": "/repo",
                                 "originator": "codex-tui", "cli_version": "0.140.0", "source": "cli",
                                 "model_provider": "openai", "base_instructions": {"text": base}})


def turn(model: str = "gpt-5.5") -> dict:
    return line("turn_context", {"turn_id": "t1", "cwd": "/repo", "approval_policy": "never", "model": model,
                                 "effort": "high", "summary": "auto"})


def msg(role: str, body: str, **extra) -> dict:
    part = "output_text" if role == "assistant" else "input_text"
    return line("response_item", {"type": "message", "role": role, "content": [{"type": part, "text": body}], **extra})


def reasoning(tag: str = "") -> dict:
    return line("response_item", {"type": "reasoning", "summary": [], "encrypted_content": f"REDACTED{tag}"})


def call(cid: str, args: str = '{"cmd":"ls","workdir":"/repo"}', name: str = "exec_command") -> dict:
    return line("response_item", {"type": "function_call", "name": name, "arguments": args, "call_id": cid})


def out(cid: str, output) -> dict:
    return line("response_item", {"type": "function_call_output", "call_id": cid, "output": output})


def tokens(inp: int, cached: int, output: int, total_in: int, ts: str | None = None) -> dict:
    last = {"input_tokens": inp, "cached_input_tokens": cached, "output_tokens": output,
            "reasoning_output_tokens": 0, "total_tokens": inp + output}
    total = {**last, "input_tokens": total_in, "total_tokens": total_in + output}
    return line("event_msg", {"type": "token_count", "rate_limits": {"limit_id": "codex"},
                              "info": {"total_token_usage": total, "last_token_usage": last,
                                       "model_context_window": 258400}}, ts)


def event(kind: str, **fields) -> dict:
    return line("event_msg", {"type": kind, **fields})


def header(text: str, code: int = 0) -> str:
    return f"Chunk ID: 1e3d7f\nWall time: 0.0100 seconds\nProcess exited with code {code}\nOriginal token count: 5\nOutput:\n{text}"


def write(tmp_path: Path, lines: list, name: str = "rollout-2026-06-18T00-52-03-abc.jsonl") -> Path:
    p = tmp_path / name
    body = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    if name.endswith(".gz"):
        with gzip.open(p, "wt", encoding="utf-8") as f:
            f.write(body)
    else:
        p.write_text(body, encoding="utf-8")
    return p


def read_one(path: Path):
    traces = list(read_traces(path))
    assert len(traces) == 1
    return traces[0]


def roles(trace) -> list[str]:
    return [m.role for m in trace.messages]


def assert_paired(trace) -> None:
    """Each call answered by one tool message right after its assistant message (calls of the last
    assistant message may stay unanswered); every tool message answers a call; call ids unique."""
    msgs = trace.messages
    ids = [c.id for m in msgs for c in m.tool_calls]
    assert len(ids) == len(set(ids))
    last = max((i for i, m in enumerate(msgs) if m.role == "assistant"), default=-1)
    i = 0
    while i < len(msgs):
        assert msgs[i].role != "tool", f"{trace.trace_id}: stray tool message {i}"
        j = i + 1
        if msgs[i].tool_calls:
            while j < len(msgs) and msgs[j].role == "tool":
                j += 1
            got = [m.tool_call_id for m in msgs[i + 1:j]]
            want = [c.id for c in msgs[i].tool_calls]
            assert got == want[:len(got)] and (i == last or got == want), f"{trace.trace_id}: message {i}"
        i = j


# ----------------------------------------------------------------------------- detection

def test_registered_before_openai_chat() -> None:
    names = list(READERS)
    assert "codex" in names and names.index("codex") < names.index("openai-chat")


def test_sniff_accepts_rollout_lines_and_rejects_other_formats() -> None:
    assert codex.sniff(session())
    for first in (turn(), msg("user", "hi"), event("task_started"), line("compacted", {"message": "s"})):
        assert codex.sniff(first)
    claude = {"type": "user", "uuid": "u1", "parentUuid": None, "sessionId": "s", "timestamp": "2026-01-01T00:00:00Z",
              "message": {"role": "user", "content": "hi"}}
    assert not codex.sniff(claude)
    assert not codex.sniff({"type": "progress", "uuid": "u", "sessionId": "s", "timestamp": "t", "data": {}})
    assert not codex.sniff({"timestamp": "t", "type": "session_meta"})  # no payload
    assert not codex.sniff({"timestamp": "t", "type": "message", "payload": {}})
    assert not codex.sniff({"format": "openai-chat", "messages": []})
    assert not codex.sniff([{"role": "user", "content": "x"}])


def test_gz_file_is_detected_and_read_like_plain(tmp_path: Path) -> None:
    lines = [session(), turn(), msg("user", "list files"), reasoning(), call("c1"), out("c1", header("a\nb")),
             tokens(100, 20, 5, 100)]
    plain = write(tmp_path, lines)
    packed = write(tmp_path, lines, "EntityProcess__agentv__019ed836.jsonl.gz")
    assert detect_format(packed) == "codex" and detect_format(plain) == "codex"
    a, b = read_one(plain), read_one(packed)
    assert a.messages == b.messages and a.meta == b.meta and a.trace_id == b.trace_id


def test_trace_id_and_session_meta(tmp_path: Path) -> None:
    base = "You are Codex.\n" * 40
    t = read_one(write(tmp_path, [session("sess-42", base), turn("gpt-5.4"), msg("user", "hi"), msg("assistant", "hello"),
                                  turn("gpt-5.5"), msg("user", "more"), msg("assistant", "ok"), turn("gpt-5.4")]))
    assert t.source == "codex" and t.trace_id == "sess-42"
    assert t.meta["cli_version"] == "0.140.0" and t.meta["system_prompt_chars"] == len(base)
    assert t.meta["model"] == "gpt-5.4" and t.meta["models"] == ["gpt-5.4", "gpt-5.5"]
    assert all("You are Codex" not in m.content for m in t.messages)  # base instructions are not a message
    # without session_meta: the file name without .jsonl / .jsonl.gz
    t2 = read_one(write(tmp_path, [msg("user", "hi")], "rollout-2026-x-0199.jsonl.gz"))
    assert t2.trace_id == "rollout-2026-x-0199" and t2.meta["system_prompt_chars"] is None


# ----------------------------------------------------------------------------- conversation

def test_one_response_is_one_assistant_message_and_results_pair_by_call_id(tmp_path: Path) -> None:
    lines = [
        session(), event("task_started", turn_id="t1"), msg("developer", "<permissions instructions>sandbox</permissions instructions>"),
        msg("user", "# AGENTS.md instructions"), turn(), msg("user", "remove the plugin"),
        event("user_message", message="remove the plugin", images=[]),
        reasoning("1"), event("agent_message", message="Checking the workspace first.", phase="commentary"),
        msg("assistant", "Checking the workspace first.", phase="commentary"),
        call("call_a", '{"cmd":"git status"}'), call("call_b", '{"cmd":"rg plugin"}'), call("call_c", '{"cmd":"ls"}'),
        out("call_c", header("x")), out("call_a", header("## main")), out("call_b", header("plugins/p")),
        tokens(22606, 2432, 351, 22606),
        reasoning("2"), event("agent_message", message="Removed it.", phase="final_answer"),
        msg("assistant", "Removed it.", phase="final_answer"), tokens(23500, 22528, 200, 46106),
        event("task_complete", last_agent_message="Removed it."),
    ]
    t = read_one(write(tmp_path, lines))
    assert roles(t) == ["system", "user", "user", "assistant", "tool", "tool", "tool", "assistant"]
    a = t.messages[3]
    assert a.content == "Checking the workspace first."
    assert [c.id for c in a.tool_calls] == ["call_a", "call_b", "call_c"]
    assert [c.arguments for c in a.tool_calls][0] == '{"cmd":"git status"}'  # the recorded JSON string
    assert [m.tool_call_id for m in t.messages[4:7]] == ["call_a", "call_b", "call_c"]
    assert t.messages[4].content == header("## main") and t.messages[4].name == "exec_command"  # header kept
    assert t.messages[7].content == "Removed it."
    # the UI's event_msg copies are never messages: one user prompt, no doubled assistant text
    assert sum(m.content == "remove the plugin" for m in t.messages) == 1
    assert sum("Removed it." in m.content for m in t.messages) == 1
    assert t.messages[0].timestamp == epoch(lines[2]["timestamp"])
    assert_paired(t)
    assert t.meta["synthetic_results"] == 0 and t.meta["orphan_results"] == 0


def test_items_of_one_response_merge_and_token_count_splits_responses(tmp_path: Path) -> None:
    # reasoning, text, reasoning, text, call: one response (one token_count after it)
    one = [session(), turn(), msg("user", "go"), reasoning(), msg("assistant", "first"), reasoning(),
           msg("assistant", "second"), call("c1"), out("c1", "ok"), tokens(10, 0, 1, 10)]
    t = read_one(write(tmp_path, one, "one.jsonl"))
    assert roles(t) == ["user", "assistant", "tool"]
    assert t.messages[1].content == "first\n\nsecond" and len(t.meta["reasoning"]["1"]) == 2
    # a final text, its token_count, then a new response with no user message between: two messages
    two = [session(), turn(), msg("user", "go"), reasoning(), msg("assistant", "done?"), tokens(10, 0, 1, 10),
           reasoning(), msg("assistant", "one more check"), call("c1"), out("c1", "ok"), tokens(12, 8, 2, 22)]
    t2 = read_one(write(tmp_path, two, "two.jsonl"))
    assert roles(t2) == ["user", "assistant", "assistant", "tool"]
    assert [u["message"] for u in t2.meta["usage"]] == [1, 2]
    # a tool output ends a response too
    three = [session(), turn(), msg("user", "go"), call("c1"), out("c1", "ok"), call("c2"), out("c2", "ok")]
    assert roles(read_one(write(tmp_path, three, "three.jsonl"))) == ["user", "assistant", "tool", "assistant", "tool"]


def test_custom_tool_call_keeps_free_text_input(tmp_path: Path) -> None:
    patch = "*** Begin Patch\n*** Update File: /repo/a.json\n@@\n-  \"x\": 1\n+  \"x\": 2\n*** End Patch\n"
    lines = [session(), turn(), msg("user", "edit"), reasoning(),
             line("response_item", {"type": "custom_tool_call", "status": "completed", "call_id": "call_p",
                                    "name": "apply_patch", "input": patch}),
             event("patch_apply_end", call_id="call_p", stdout="Success.", success=True),
             line("response_item", {"type": "custom_tool_call_output", "call_id": "call_p",
                                    "output": "Exit code: 0\nWall time: 0.1 seconds\nOutput:\nSuccess. Updated the following files:\nM /repo/a.json\n"}),
             tokens(10, 0, 1, 10)]
    t = read_one(write(tmp_path, lines))
    (c,) = t.messages[1].tool_calls
    assert (c.id, c.name, c.arguments) == ("call_p", "apply_patch", patch)  # as is, not JSON
    assert t.messages[2].role == "tool" and t.messages[2].tool_call_id == "call_p"
    assert t.messages[2].content.startswith("Exit code: 0") and t.messages[2].name == "apply_patch"
    assert len(t.messages) == 3  # patch_apply_end is a UI event


def test_reasoning_is_not_a_message_but_kept_in_meta(tmp_path: Path) -> None:
    r1 = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}],
          "encrypted_content": "gAAAA-secret", "internal_chat_message_metadata_passthrough": {"turn_id": "t1"}}
    r2 = {"summary": [], "type": "reasoning"}
    lines = [session(), turn(), msg("user", "go"), line("response_item", r1), call("c1"), out("c1", "ok"),
             tokens(10, 0, 1, 10), line("response_item", r2), msg("assistant", "done"), tokens(12, 8, 2, 22)]
    t = read_one(write(tmp_path, lines))
    assert roles(t) == ["user", "assistant", "tool", "assistant"]
    assert t.meta["reasoning"] == {"1": [r1], "3": [r2]}
    assert all("gAAAA" not in m.content and "plan" not in m.content for m in t.messages)
    assert t.messages[1].content == ""  # the response had no text, only its call


def test_recorded_usage_one_entry_per_response(tmp_path: Path) -> None:
    t_a, t_b = "2026-06-18T02:00:00.000Z", "2026-06-18T02:00:09.500Z"
    lines = [
        session(), turn("gpt-5.5"), msg("user", "go"), reasoning(), msg("assistant", "a"), call("c1"), out("c1", "ok"),
        tokens(22606, 2432, 351, 22606, t_a),
        line("event_msg", {"type": "token_count", "info": None, "rate_limits": {"limit_id": "codex"}}),  # rate limits only
        tokens(22606, 2432, 351, 22606),  # the same totals again: a repeat, dropped
        msg("assistant", "interrupted"), call("c2"), out("c2", "aborted by user after 2.0s"),  # no token_count
        msg("user", "<turn_aborted>\nThe user interrupted the previous turn.\n</turn_aborted>"),
        event("turn_aborted", reason="interrupted"), turn("gpt-5.3-codex-spark"), msg("user", "again"),
        reasoning(), msg("assistant", "b"), tokens(30000, 24000, 99, 80000, t_b),
    ]
    t = read_one(write(tmp_path, lines))
    assert roles(t) == ["user", "assistant", "tool", "assistant", "tool", "user", "user", "assistant"]
    u = t.meta["usage"]
    assert u == [
        {"message": 1, "input": 22606 - 2432, "cache_read": 2432, "cache_write": 0, "cache_write_1h": 0, "output": 351,
         "model": "gpt-5.5", "timestamp": epoch(t_a)},
        {"message": 7, "input": 6000, "cache_read": 24000, "cache_write": 0, "cache_write_1h": 0, "output": 99,
         "model": "gpt-5.3-codex-spark", "timestamp": epoch(t_b)},
    ]
    assert t.meta["usage_duplicates"] == 1 and t.meta["responses_without_usage"] == 1
    assert t.meta["usage_unmatched"] == 0


def test_web_search_tool_search_and_mcp_namespace(tmp_path: Path) -> None:
    tools = [{"type": "namespace", "name": "mcp__codex_apps__github", "tools": [{"type": "function", "name": "_fetch_pr"}]}]
    lines = [
        session(), turn(), msg("user", "look it up"),
        event("web_search_end", call_id="ws_1", query="q", action={"type": "search", "query": "q"}),
        reasoning(), line("response_item", {"type": "web_search_call", "status": "completed",
                                            "action": {"type": "search", "query": "q"}}),
        reasoning(), line("response_item", {"type": "web_search_call", "id": "ws_2", "status": "completed",
                                            "action": {"type": "open_page", "url": "https://example.org"}}),
        reasoning(), msg("assistant", "found it"), call("c1"), out("c1", "ok"), tokens(10, 0, 1, 10),
        line("response_item", {"type": "tool_search_call", "call_id": "call_s", "status": "completed",
                               "execution": "client", "arguments": {"query": "github pr", "limit": 5}}),
        line("response_item", {"type": "tool_search_output", "call_id": "call_s", "status": "completed",
                               "execution": "client", "tools": tools}),
        tokens(20, 10, 1, 30),
        line("response_item", {"type": "function_call", "name": "_fetch_pr", "namespace": "mcp__codex_apps__github",
                               "arguments": '{"pr_number":255}', "call_id": "call_m"}),
        event("mcp_tool_call_end", call_id="call_m", result={"Ok": {}}),
        out("call_m", [{"type": "input_text", "text": "PR 255"}]), tokens(30, 20, 1, 60),
        line("response_item", {"type": "ghost_snapshot", "ghost_commit": {}}),
    ]
    t = read_one(write(tmp_path, lines))
    assert roles(t) == ["user", "assistant", "tool", "tool", "tool", "assistant", "tool", "assistant", "tool"]
    a = t.messages[1]  # the searches ran inside one response: one message, three calls
    assert [c.name for c in a.tool_calls] == ["web_search", "web_search", "exec_command"]
    assert a.tool_calls[1].id == "ws_2" and json.loads(a.tool_calls[0].arguments) == {"type": "search", "query": "q"}
    assert t.messages[2].content == codex.WEB_SEARCH_RESULT and t.messages[4].content == "ok"
    s = t.messages[5].tool_calls[0]
    assert (s.id, s.name, json.loads(s.arguments)) == ("call_s", "tool_search", {"query": "github pr", "limit": 5})
    assert json.loads(t.messages[6].content) == tools
    assert t.messages[7].tool_calls[0].name == "mcp__codex_apps__github_fetch_pr" and t.messages[8].content == "PR 255"
    assert t.meta["web_search_calls"] == 2 and t.meta["tool_search_calls"] == 1
    assert t.meta["skipped_items"] == {"ghost_snapshot": 1}
    assert [u["message"] for u in t.meta["usage"]] == [1, 5, 7]
    assert t.meta["synthetic_results"] == 0 and t.meta["orphan_results"] == 0
    assert_paired(t)


def test_local_shell_call_of_older_codex(tmp_path: Path) -> None:
    action = {"type": "exec", "command": ["bash", "-lc", "ls"], "working_directory": "/repo"}
    lines = [session(), msg("user", "go"), line("response_item", {"type": "local_shell_call", "call_id": "call_l",
                                                                  "status": "completed", "action": action}),
             out("call_l", '{"output":"a\\nb","metadata":{"exit_code":0}}'), msg("assistant", "two files")]
    t = read_one(write(tmp_path, lines))
    (c,) = t.messages[1].tool_calls
    assert (c.id, c.name, json.loads(c.arguments)) == ("call_l", "local_shell", action)
    assert t.messages[2].tool_call_id == "call_l" and t.messages[2].name == "local_shell"


def test_images_are_kept_as_media(tmp_path: Path) -> None:
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + struct.pack(">II", 1024, 1024) + b"\x08\x02\x00\x00\x00"
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    image = {"type": "input_image", "image_url": url}
    lines = [session(), turn(),
             line("response_item", {"type": "message", "role": "user",
                                    "content": [{"type": "input_text", "text": "what is this?"}, image]}),
             call("c1", '{"path":"/repo/shot.png"}', "view_image"),
             out("c1", [{"type": "input_text", "text": "the screenshot"}, image]), msg("assistant", "a chart")]
    t = read_one(write(tmp_path, lines))
    user, tool = t.messages[0], t.messages[2]
    assert user.content == "what is this?\n[input_image]" and json.loads(user.media) == [image]
    assert tool.role == "tool" and json.loads(tool.media) == [image]
    assert media_tokens(user.media, len) == 765  # 1024 x 1024 -> 768 x 768: 4 tiles (signals/media.py)
    assert t.messages[1].media == "" and t.messages[3].media == ""
    assert user.timestamp == epoch(lines[2]["timestamp"])


# ----------------------------------------------------------------------------- compaction

def test_compaction_records_at_and_kept(tmp_path: Path) -> None:
    enc = "gAAAAB" + "x" * 994
    history = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions instructions>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the build"}]},
        {"type": "compaction", "encrypted_content": enc},
    ]
    t_c = "2026-06-18T03:00:00.000Z"
    lines = [
        session(), turn(), msg("user", "fix the build"), reasoning(), msg("assistant", "looking"), call("c1"),
        out("c1", "ok"), tokens(200000, 190000, 50, 200000),
        call("c0"),  # interrupted by the compaction: no output, the pairing pass adds one (before `at`)
        line("compacted", {"message": "", "replacement_history": history}, t_c),
        event("context_compacted"),  # the same compaction, announced to the UI
        turn(), msg("user", "<environment_context>\n  <cwd>/repo</cwd>\n</environment_context>"),
        reasoning(), msg("assistant", "continuing"), call("c2"), out("c2", "done"), tokens(9000, 0, 40, 209000),
        msg("assistant", "finished"),
    ]
    t = read_one(write(tmp_path, lines))
    # the compacted line adds nothing
    assert roles(t) == ["user", "assistant", "tool", "assistant", "tool", "user", "assistant", "tool", "assistant"]
    assert t.meta["synthetic_results"] == 1
    (c,) = t.meta["compactions"]
    assert c["at"] == 5 and t.messages[5].content.startswith("<environment_context>")
    assert (c["trigger"], c["pre_tokens"], c["timestamp"], c["source"]) == ("auto", None, epoch(t_c), "compacted")
    kept = [Message.from_openai(m) for m in c["kept"]]
    assert [(m.role, m.content) for m in kept] == [
        ("system", "<permissions instructions>"), ("user", "fix the build"),
        ("user", "[compaction summary: 1000 characters, encrypted]")]
    assert c["kept"][0] == Message("system", "<permissions instructions>").to_dict()
    # the context of the call after it: kept + messages[at:j]
    j = t.meta["usage"][1]["message"]
    assert j == 6 and [m.content for m in kept + t.messages[c["at"]:j]][-1].startswith("<environment_context>")


def test_compaction_at_end_and_event_only_and_summary_only(tmp_path: Path) -> None:
    end = [session(), turn(), msg("user", "go"), msg("assistant", "ok"),
           line("compacted", {"message": "", "replacement_history": [
               {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}]})]
    t = read_one(write(tmp_path, end, "end.jsonl"))
    assert t.meta["compactions"][0]["at"] == len(t.messages) == 2
    alone = [session(), turn(), msg("user", "go"), msg("assistant", "ok"), event("context_compacted"),
             msg("user", "next")]
    (c,) = read_one(write(tmp_path, alone, "alone.jsonl")).meta["compactions"]
    assert (c["at"], c["kept"], c["source"]) == (2, [], "context_compacted")
    older = [session(), msg("user", "go"), msg("assistant", "ok"), event("context_compacted"),
             line("compacted", {"message": "Summary: the build is fixed."}), msg("user", "next")]
    (c,) = read_one(write(tmp_path, older, "older.jsonl")).meta["compactions"]
    assert c["source"] == "compacted" and c["kept"] == [Message("user", "Summary: the build is fixed.").to_dict()]
    assert c["at"] == 2


# ----------------------------------------------------------------------------- errors

def test_unreadable_line_rest_read_then_one_error(tmp_path: Path) -> None:
    p = write(tmp_path, [session(), msg("user", "go"), "{broken", msg("assistant", "ok"), "also broken"])
    got = []
    with pytest.raises(TraceFormatError) as exc:
        for t in codex.read(p):
            got.append(t)
    assert len(got) == 1 and roles(got[0]) == ["user", "assistant"]
    e = exc.value
    assert (e.path, e.format, e.field) == (str(p), "codex", "line 3") and "line 5" in str(e)
    with pytest.raises(TraceFormatError):
        list(read_traces(p))


@pytest.mark.parametrize("bad, field", [
    (line("response_item", {"type": "function_call", "name": "exec_command", "arguments": {"cmd": "ls"}, "call_id": "c"}),
     "line 3.payload.arguments"),
    (line("response_item", {"type": "function_call_output", "call_id": "c", "output": 5}), "line 3.payload.output"),
    (line("response_item", {"type": "message", "role": "robot", "content": []}), "line 3.payload.role"),
    (line("response_item", {"type": "custom_tool_call", "call_id": 7, "name": "apply_patch", "input": ""}),
     "line 3.payload.call_id"),
    (line("event_msg", {"type": "token_count", "info": {"last_token_usage": {"input_tokens": "many"}}}),
     "line 3.payload.info.last_token_usage.input_tokens"),
    (line("compacted", {"replacement_history": "nope"}), "line 3.payload.replacement_history"),
    ({"timestamp": "t", "type": "response_item", "payload": []}, "line 3.payload"),
])
def test_wrong_typed_field_names_file_format_field(tmp_path: Path, bad: dict, field: str) -> None:
    p = write(tmp_path, [session(), msg("user", "go"), bad, msg("assistant", "ok")])
    with pytest.raises(TraceFormatError) as exc:
        list(read_traces(p))
    e = exc.value
    assert (e.path, e.format, e.field) == (str(p), "codex", field)
    assert str(e).startswith(f"{p}: format codex: field {field}: ")


# ----------------------------------------------------------------------------- the real sessions

# SOURCES.md, table "codex/": session id -> tool results (function_call_output + custom_tool_call_output)
SOURCES_RESULTS = {
    "019eef3d-abd1-72e1-ab99-dcdb259027c5": 148, "019ed9f4-6510-7fc0-8643-6d434f193bd0": 111,
    "019f05f8-7f53-7492-a941-83098e16765c": 111, "019ed936-c4f5-7a21-ad41-d1eed95dc4df": 109,
    "019ed50c-2fb3-7002-a384-360bea6e7f04": 100, "019f15f7-b472-7bc3-8651-5547781e25cf": 98,
    "019ed917-1cf7-72a3-92f5-c0aa98fb134e": 98, "019f1de1-ca1d-7261-9e32-4d51380144e6": 76,
    "019efedf-a8dc-7b20-ba1d-f1c6ff7ea96e": 66, "019ed836-b1da-78f1-8a0c-e598363d10f4": 21,
}


def _raw(path: Path) -> Counter:
    """Counts straight from the lines: response item types and roles, and the last total input."""
    c: Counter = Counter()
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for text_line in f:
            o = json.loads(text_line)
            p = o["payload"]
            if o["type"] == "response_item":
                c[p["type"] if p["type"] != "message" else f"message:{p['role']}"] += 1
            elif o["type"] == "event_msg" and p["type"] == "token_count" and p["info"]:
                c["total_input"] = p["info"]["total_token_usage"]["input_tokens"]
    return c


@pytest.fixture(scope="module")
def real(sessions_dir: Path) -> dict[str, tuple]:
    folder = sessions_dir / "codex"
    if not folder.is_dir():
        pytest.skip(f"no codex/ folder in {sessions_dir}")
    files = sorted(folder.glob("*.jsonl.gz"))
    return {f.name: (f, read_one(f), _raw(f)) for f in files}


def test_real_all_ten_read_and_paired(real) -> None:
    assert len(real) == 10
    for name, (f, t, _) in real.items():
        assert detect_format(f) == "codex"
        assert t.trace_id in name and t.trace_id in SOURCES_RESULTS
        assert_paired(t)
        assert t.meta["synthetic_results"] == 0 and t.meta["orphan_results"] == 0 and t.meta["renamed_call_ids"] == 0
        assert t.meta["skipped_items"] == {} and t.meta["compactions"] == []
        assert t.meta["cli_version"].startswith("0.14") and t.meta["system_prompt_chars"] > 10000
        assert t.meta["repository"] == "https://github.com/EntityProcess/agentv.git"  # session_meta's git, in each


def test_real_tool_results_match_sources(real) -> None:
    """Tool messages = SOURCES.md's tool results (function and custom call outputs) + the tool
    search outputs + one synthesized result per web search."""
    for _, (_, t, raw) in real.items():
        results = [m for m in t.messages if m.role == "tool"]
        web = sum(m.name == "web_search" for m in results)
        search = sum(m.name == "tool_search" for m in results)
        assert web == raw["web_search_call"] and search == raw["tool_search_output"]
        assert len(results) - web - search == SOURCES_RESULTS[t.trace_id], t.trace_id
    assert sum(SOURCES_RESULTS.values()) == 938
    by_id = {t.trace_id: t for _, t, _ in real.values()}
    assert sum(m.role == "tool" for m in by_id["019ed836-b1da-78f1-8a0c-e598363d10f4"].messages) == 21
    assert sum(m.role == "tool" for m in by_id["019eef3d-abd1-72e1-ab99-dcdb259027c5"].messages) == 148 + 1  # 1 web search
    assert by_id["019ed836-b1da-78f1-8a0c-e598363d10f4"].meta["unanswered_final_calls"] == 2  # ends mid-call


def test_real_messages_and_reasoning_match_raw_items(real) -> None:
    for _, (_, t, raw) in real.items():
        got = Counter(m.role for m in t.messages)
        assert got["user"] == raw["message:user"] and got["system"] == raw["message:developer"]
        assert got["assistant"] <= raw["message:assistant"] + raw["function_call"] + raw["custom_tool_call"]
        assert sum(len(v) for v in t.meta["reasoning"].values()) == raw["reasoning"]
        assert all(t.messages[int(k)].role == "assistant" for k in t.meta["reasoning"])
        calls = sum(len(m.tool_calls) for m in t.messages)
        assert calls == (raw["function_call"] + raw["custom_tool_call"] + raw["web_search_call"]
                         + raw["tool_search_call"])
        texts = sum(bool(m.content) for m in t.messages if m.role == "assistant")
        assert texts <= raw["message:assistant"]


def test_real_usage_covers_the_assistant_messages(real) -> None:
    entries = 0
    for _, (_, t, raw) in real.items():
        usage, meta = t.meta["usage"], t.meta
        assistants = [i for i, m in enumerate(t.messages) if m.role == "assistant"]
        idx = [u["message"] for u in usage]
        assert idx == sorted(set(idx)) and set(idx) <= set(assistants)
        assert len(usage) == len(assistants) - meta["responses_without_usage"]
        assert meta["responses_without_usage"] <= 2 and meta["usage_unmatched"] == 0
        assert all(u["model"] in meta["models"] and u["input"] >= 0 and u["timestamp"] for u in usage)
        recorded_in = sum(u["input"] + u["cache_read"] for u in usage)
        if t.trace_id.startswith("019eef3d"):  # an interrupted call is in the running total, with no usage line
            assert 0 < raw["total_input"] - recorded_in < 100_000
        else:
            assert recorded_in == raw["total_input"], t.trace_id
        entries += len(usage)
    assert entries == 520  # 521 token_count lines, one of them a repeat
    models = {t.trace_id[:8]: (t.meta["model"], t.meta["models"]) for _, t, _ in real.values()}
    assert models["019ed836"] == ("gpt-5.4", ["gpt-5.4"])
    assert models["019eef3d"][0] == "gpt-5.5" and "gpt-5.3-codex-spark" in models["019eef3d"][1]
