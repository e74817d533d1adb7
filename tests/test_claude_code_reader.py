"""The Claude Code session reader (``historygraph.traces.claude_code``): small excerpts modelled on
real lines for each rule, and the real sessions of the shared ``claude-code/`` folder."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from historygraph.history.events import Message
from historygraph.signals.media import media_tokens
from historygraph.traces import READERS, TraceFormatError, detect_format, read_traces
from historygraph.traces import claude_code as cc
from historygraph.traces._common import NO_RESULT

SID = "5f0c1d2e-0000-4000-8000-000000000001"
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


class Lines:
    """Builds Claude Code lines as the client writes them (uuid chain, session id, timestamps)."""

    def __init__(self) -> None:
        self.n = 0
        self.last: str | None = None

    def _base(self, kind: str, **kw) -> dict:
        self.n += 1
        uuid = kw.pop("uuid", f"u-{self.n}")
        rec = {"parentUuid": self.last, "isSidechain": False, "userType": "external", "cwd": "/work/repo",
               "sessionId": SID, "version": "2.1.17", "gitBranch": "main", "type": kind, "uuid": uuid,
               "timestamp": f"2026-01-20T10:00:{self.n:02d}.000Z", **kw}
        self.last = uuid
        return rec

    def user(self, content, **kw) -> dict:
        return self._base("user", message={"role": "user", "content": content}, **kw)

    def result(self, call_id: str, content, big: object = None, **kw) -> dict:
        block = {"tool_use_id": call_id, "type": "tool_result", "content": content, **kw}
        return self.user([block], toolUseResult=big if big is not None else {"stdout": content})

    def asst(self, mid: str, block: dict, output: int = 1, model: str = "claude-opus-4-5-20251101",
             usage: dict | None = None) -> dict:
        u = usage if usage is not None else {
            "input_tokens": 3, "cache_creation_input_tokens": 200, "cache_read_input_tokens": 1000,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 200},
            "output_tokens": output, "service_tier": "standard"}
        msg = {"model": model, "id": mid, "type": "message", "role": "assistant", "content": [block],
               "stop_reason": None, "usage": u}
        return self._base("assistant", message=msg, requestId=f"req_{mid}")

    def other(self, kind: str, **kw) -> dict:
        return self._base(kind, **kw)


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def tool_use(i: str, name: str = "Bash", **inp) -> dict:
    return {"type": "tool_use", "id": i, "name": name, "input": inp or {"command": "ls"}}


THINK = {"type": "thinking", "thinking": "Let me look at the file first.", "signature": "EuYBCkYIBhgCKkB=="}


def write(tmp_path: Path, recs: list, name: str = f"{SID}.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return p


def read_one(p: Path):
    (t,) = read_traces(p)
    return t


def shape(t) -> list[tuple]:
    return [(m.role, m.content, m.tool_call_id, tuple(c.id for c in m.tool_calls)) for m in t.messages]


# ----------------------------------------------------------------------------- detection


def test_sniff_matches_claude_code_lines_only() -> None:
    L = Lines()
    for rec in (L.user("hi"), L.asst("msg_1", text("x")), L.other("progress", data={"type": "hook_progress"}),
                {"type": "file-history-snapshot", "messageId": "m", "snapshot": {}, "isSnapshotUpdate": False},
                {"type": "queue-operation", "operation": "enqueue", "timestamp": "t", "sessionId": SID},
                {"type": "summary", "summary": "A title", "leafUuid": "u-1"},
                {"type": "pr-link", "sessionId": SID, "prNumber": 3}):
        assert cc.sniff(rec), rec
        assert [n for n, m in READERS.items() if m.sniff(rec)][0] == "claude-code", rec
    codex = [{"timestamp": "2026-01-01T00:00:00Z", "type": "session_meta", "payload": {"id": "x"}},
             {"timestamp": "2026-01-01T00:00:00Z", "type": "response_item", "payload": {"type": "message"}}]
    for rec in (*codex, {"type": "user", "content": "no ids"}, {"role": "user", "content": "x"},
                {"format": "openai-chat", "messages": []}, [{"role": "user"}], "user"):
        assert not cc.sniff(rec), rec


def test_gz_file_detected_and_read(tmp_path: Path) -> None:
    L = Lines()
    recs = [L.other("progress", data={}), L.user("hello"), L.asst("msg_1", text("hi there"))]
    p = tmp_path / f"{SID}.jsonl.gz"
    p.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in recs).encode()))
    assert detect_format(p) == "claude-code"
    t = read_one(p)
    assert (t.source, t.trace_id, t.path) == ("claude-code", SID, str(p))
    assert shape(t) == [("user", "hello", None, ()), ("assistant", "hi there", None, ())]
    assert t.messages[0].timestamp == pytest.approx(1768903202.0)
    assert (t.meta["model"], t.meta["agent_version"], t.meta["cwd"]) == ("claude-opus-4-5-20251101", "2.1.17", "/work/repo")


def test_trace_id_falls_back_to_the_file_name(tmp_path: Path) -> None:
    recs = [{"type": "user", "uuid": "a", "message": {"role": "user", "content": "hi"}}]
    assert read_one(write(tmp_path, recs, "abc-123.jsonl")).trace_id == "abc-123"


# ----------------------------------------------------------------------------- assistant replies


def test_streamed_reply_merged_by_message_id_across_interleaved_results(tmp_path: Path) -> None:
    L = Lines()
    recs = [L.user("fix it"),
            L.asst("msg_1", THINK), L.asst("msg_1", text("Two checks.")),
            L.asst("msg_1", tool_use("t1", command="ls")),
            L.result("t1", "a.go"),  # written before the reply's next block
            L.asst("msg_1", tool_use("t2", "Read", file_path="/a.go")),
            L.result("t2", "package a"),
            L.asst("msg_2", text("Done."))]
    t = read_one(write(tmp_path, recs))
    assert shape(t) == [("user", "fix it", None, ()), ("assistant", "Two checks.", None, ("t1", "t2")),
                        ("tool", "a.go", "t1", ()), ("tool", "package a", "t2", ()), ("assistant", "Done.", None, ())]
    calls = t.messages[1].tool_calls
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("Bash", {"command": "ls"}), ("Read", {"file_path": "/a.go"})]
    assert calls[1].arguments == json.dumps({"file_path": "/a.go"}, ensure_ascii=False)
    assert t.messages[3].name == "Read"
    # thinking is kept out of the message, byte for byte in meta
    assert "look at the file" not in t.messages[1].content and t.messages[1].provider_blocks == ""
    assert t.meta["reasoning"] == {"1": [THINK]}
    assert t.meta["synthetic_results"] == 0 and t.meta["orphan_results"] == 0


def test_usage_takes_the_largest_output_never_the_sum(tmp_path: Path) -> None:
    L = Lines()
    recs = [L.user("go"), L.asst("msg_1", text("a"), output=1), L.asst("msg_1", tool_use("t1"), output=57),
            L.result("t1", "ok"), L.asst("msg_2", text("b"), output=9,
                                         usage={"input_tokens": 5, "output_tokens": 9})]
    t = read_one(write(tmp_path, recs))
    assert t.meta["usage"] == [
        {"message": 1, "input": 3, "cache_read": 1000, "cache_write": 200, "cache_write_1h": 200, "output": 57,
         "model": "claude-opus-4-5-20251101", "timestamp": t.messages[1].timestamp},
        {"message": 3, "input": 5, "cache_read": 0, "cache_write": 0, "cache_write_1h": 0, "output": 9,
         "model": "claude-opus-4-5-20251101", "timestamp": t.messages[3].timestamp}]
    assert t.meta["usage"][0]["timestamp"] == pytest.approx(1768903202.0)  # the first line's


def test_synthetic_and_sidechain_assistant_lines_skipped(tmp_path: Path) -> None:
    L = Lines()
    synthetic = L.asst("5828ecc9-6264", text("No response requested."), model="<synthetic>",
                       usage={"input_tokens": 0, "output_tokens": 0})
    side = L.asst("msg_9", text("subagent"))
    side["isSidechain"] = True
    recs = [L.user("hi"), L.asst("msg_1", text("hello")), synthetic, side]
    t = read_one(write(tmp_path, recs))
    assert shape(t) == [("user", "hi", None, ()), ("assistant", "hello", None, ())]
    assert t.meta["skipped_lines"] == {"synthetic": 1, "sidechain": 1}
    assert len(t.meta["usage"]) == 1


# ----------------------------------------------------------------------------- tool results


def test_tool_results_are_what_the_model_saw(tmp_path: Path) -> None:
    L = Lines()
    persisted = ("<persisted-output>\nOutput too large (100.5KB). Full output saved to: /tmp/x.txt\n\n"
                 "Preview (first 2KB):\nline 1\nline 2\n...\n</persisted-output>")
    recs = [L.user("go"),
            L.asst("msg_1", tool_use("t1", "Read", file_path="/a")), L.asst("msg_1", tool_use("t2")),
            L.asst("msg_1", tool_use("t3")),
            L.result("t1", "     1\tshort", big={"file": {"content": "THE WHOLE FILE " * 100}}),
            L.result("t2", persisted, big={"stdout": "x" * 100_000}),
            L.result("t3", "Exit code 1\nboom", is_error=True),
            L.asst("msg_2", text("ok"))]
    t = read_one(write(tmp_path, recs))
    tools = [m for m in t.messages if m.role == "tool"]
    assert [m.content for m in tools] == ["     1\tshort", persisted, "Exit code 1\nboom"]
    assert all("WHOLE FILE" not in m.content for m in t.messages)


def test_images_kept_as_media(tmp_path: Path) -> None:
    L = Lines()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    recs = [L.user([text("what is this?"), image]),
            L.asst("msg_1", tool_use("t1", "Read", file_path="/s.png")),
            L.result("t1", [text("Read image (1x1)"), image]),
            L.asst("msg_2", text("A pixel."))]
    t = read_one(write(tmp_path, recs))
    user, _, tool, _ = t.messages
    assert (user.content, tool.content) == ("what is this?\n[image]", "Read image (1x1)\n[image]")
    for m in (user, tool):
        assert json.loads(m.media) == [image]
        assert media_tokens(m.media, len) == 1  # 1x1 px: the Anthropic image estimate reads the block
    assert t.messages[1].media == "" and t.messages[3].media == ""


def test_user_text_beside_results_follows_them(tmp_path: Path) -> None:
    L = Lines()
    mixed = L.user([{"tool_use_id": "t1", "type": "tool_result", "content": "r1"}, text("also check b")])
    recs = [L.user("go"), L.asst("msg_1", tool_use("t1")), mixed, L.asst("msg_2", text("ok"))]
    assert shape(read_one(write(tmp_path, recs)))[1:4] == [
        ("assistant", "", None, ("t1",)), ("tool", "r1", "t1", ()), ("user", "also check b", None, ())]


def test_interrupted_calls_get_results(tmp_path: Path) -> None:
    L = Lines()
    recs = [L.user("go"), L.asst("msg_1", tool_use("t1")), L.asst("msg_1", tool_use("t2")),
            L.result("t1", "done"), L.user([text("[Request interrupted by user for tool use]")]),
            L.user("do something else"), L.asst("msg_2", tool_use("t3"))]
    t = read_one(write(tmp_path, recs))
    assert shape(t) == [
        ("user", "go", None, ()), ("assistant", "", None, ("t1", "t2")), ("tool", "done", "t1", ()),
        ("tool", NO_RESULT, "t2", ()), ("user", "[Request interrupted by user for tool use]", None, ()),
        ("user", "do something else", None, ()), ("assistant", "", None, ("t3",))]
    assert t.meta["synthetic_results"] == 1 and t.meta["unanswered_final_calls"] == 1


# ----------------------------------------------------------------------------- lines that are not conversation


def test_non_conversation_lines_skipped_and_counted(tmp_path: Path) -> None:
    L = Lines()
    caveat = L.user("<local-command-caveat>Caveat: The messages below were generated by the user while running "
                    "local commands. DO NOT respond to these messages.</local-command-caveat>", isMeta=True)
    recs = [{"type": "file-history-snapshot", "messageId": "m1", "snapshot": {"trackedFileBackups": {}},
             "isSnapshotUpdate": False},
            L.other("progress", data={"type": "hook_progress", "hookEvent": "SessionStart"}),
            L.user("first"), L.asst("msg_1", tool_use("t1")),
            L.other("progress", data={"type": "bash_progress", "output": "partial"}, toolUseID="t1"),
            L.result("t1", "out"), L.asst("msg_2", text("answer")),
            L.other("system", subtype="stop_hook_summary", hookCount=1),
            L.other("system", subtype="turn_duration", durationMs=1200),
            {"type": "queue-operation", "operation": "enqueue", "timestamp": "t", "sessionId": SID, "content": "q"},
            {"type": "summary", "summary": "Fixing things", "leafUuid": "u-5"},
            {"type": "pr-link", "sessionId": SID, "prNumber": 7, "prUrl": "u", "timestamp": "t"},
            caveat,
            L.user("<command-name>/exit</command-name>\n            <command-message>exit</command-message>\n"
                   "            <command-args></command-args>"),
            L.user("<local-command-stdout>Goodbye!</local-command-stdout>"),
            L.user("<system-reminder>\nremember\n</system-reminder>"),
            L.user("<bash-input>pwd</bash-input>"), L.user("<bash-stdout>/work</bash-stdout><bash-stderr></bash-stderr>"),
            L.user("<command-name>/review</command-name> and then explain it"),
            L.user(""),
            L.asst("msg_3", text("next"))]
    t = read_one(write(tmp_path, recs))
    assert [m.content for m in t.messages] == [
        "first", "", "out", "answer", "<bash-input>pwd</bash-input>", "<bash-stdout>/work</bash-stdout><bash-stderr></bash-stderr>",
        "<command-name>/review</command-name> and then explain it", "next"]
    assert t.meta["skipped_lines"] == {"file-history-snapshot": 1, "progress": 2, "system": 2, "queue-operation": 1,
                                       "summary": 1, "pr-link": 1, "meta": 1, "command": 3, "empty": 1}


def test_prompt_command_and_skill_bodies_are_user_turns(tmp_path: Path) -> None:
    # A slash command that expands into a prompt: the tag line, then an isMeta line (child of it)
    # with the body; Claude Code sends both as the user's turn. A skill the model loads with the
    # Skill tool: its body is an isMeta line after the tool result. A command line whose next
    # conversation line is not its body (a local command) stays skipped.
    L = Lines()
    cmd = "<command-message>review</command-message>\n<command-name>/review</command-name>\n<command-args>this branch</command-args>"
    recs = [L.user(cmd),
            {"type": "file-history-snapshot", "messageId": "m0", "snapshot": {}, "isSnapshotUpdate": False},
            L.user([text("You are an expert code reviewer.\n\nARGUMENTS: this branch")], isMeta=True),
            L.asst("msg_1", tool_use("t1", "Skill", skill="receiving-code-review")),
            L.result("t1", "Launching skill: receiving-code-review"),
            L.user([text("Base directory for this skill: /x\n\n# Code Review Reception")], isMeta=True,
                   sourceToolUseID="t1"),
            L.asst("msg_2", text("done")),
            L.user("<command-name>/ide</command-name>\n<command-message>ide</command-message>\n<command-args></command-args>"),
            L.user("next please"),
            L.asst("msg_3", text("ok")),
            L.user("<command-name>/exit</command-name>\n<command-message>exit</command-message>\n<command-args></command-args>")]
    t = read_one(write(tmp_path, recs))
    assert (t.messages[0].role, t.messages[0].content) == ("user", cmd + "\nYou are an expert code reviewer.\n\nARGUMENTS: this branch")
    assert t.messages[0].timestamp == pytest.approx(1768903201.0)  # the command line's, when the user typed it
    assert [m.content for m in t.messages[1:]] == [
        "", "Launching skill: receiving-code-review", "Base directory for this skill: /x\n\n# Code Review Reception",
        "done", "next please", "ok"]
    assert t.meta["skipped_lines"] == {"file-history-snapshot": 1, "command": 2}


def test_two_objects_on_one_line_and_a_rewritten_line(tmp_path: Path) -> None:
    # As in a real log: the client lost a newline between a reply and a title line, then wrote the
    # reply again (same uuid) when the session was resumed.
    L = Lines()
    first, reply = L.user("sum up"), L.asst("msg_1", text("Summary: all good."))
    title = {"type": "summary", "summary": "Title", "leafUuid": reply["uuid"]}
    p = tmp_path / f"{SID}.jsonl"
    p.write_text(json.dumps(first) + "\n" + json.dumps(reply) + json.dumps(title) + "\n" + json.dumps(reply) + "\n"
                 + json.dumps(L.user("thanks")) + "\n")
    t = read_one(p)
    assert shape(t) == [("user", "sum up", None, ()), ("assistant", "Summary: all good.", None, ()),
                        ("user", "thanks", None, ())]
    assert t.meta["skipped_lines"] == {"summary": 1, "duplicate_uuid": 1}


# ----------------------------------------------------------------------------- compaction


def _boundary(L: Lines, trigger: str = "auto", pre: int = 155301) -> dict:
    rec = L.other("system", subtype="compact_boundary", content="Conversation compacted", level="info",
                  isMeta=False, logicalParentUuid=L.last, compactMetadata={"trigger": trigger, "preTokens": pre})
    rec["parentUuid"] = None
    return rec


SUMMARY = ("This session is being continued from a previous conversation that ran out of context. The summary "
           "below covers the earlier portion of the conversation.\n\nAnalysis: we fixed the bug.")


def test_compaction_recorded_and_summary_kept_out_of_messages(tmp_path: Path) -> None:
    L = Lines()
    recs = [L.user("start"), L.asst("msg_1", tool_use("t1")), L.result("t1", "r1"), L.asst("msg_2", text("so far")),
            _boundary(L), L.user(SUMMARY, isCompactSummary=True, isVisibleInTranscriptOnly=True),
            L.other("progress", data={}),
            L.asst("msg_3", tool_use("t2")), L.result("t2", "r2"), L.asst("msg_4", text("continued")),
            _boundary(L, "manual", 99000), L.user(SUMMARY + " 2", isCompactSummary=True),
            L.user("<command-name>/compact</command-name>"),
            L.user("<local-command-stdout>Compacted</local-command-stdout>")]
    t = read_one(write(tmp_path, recs))
    assert SUMMARY not in [m.content for m in t.messages]
    assert [m.content for m in t.messages] == ["start", "", "r1", "so far", "", "r2", "continued"]
    first, second = t.meta["compactions"]
    assert first == {"at": 4, "kept": [Message(role="user", content=SUMMARY).to_dict()], "trigger": "auto",
                     "pre_tokens": 155301, "timestamp": pytest.approx(1768903205.0)}
    assert (second["at"], second["trigger"], second["pre_tokens"]) == (len(t.messages), "manual", 99000)
    assert second["kept"][0]["content"] == SUMMARY + " 2"
    # the context the agent sent for msg_4: the summary, then what followed the compaction
    j = 6
    sent = first["kept"] + [m.to_dict() for m in t.messages[first["at"]:j]]
    assert [m["content"] for m in sent] == [SUMMARY, "", "r2"]


def test_compaction_point_taken_after_pairing(tmp_path: Path) -> None:
    # An interrupted call gets a synthetic result and a late result moves up to its call: "at"
    # counts the messages after pairing, not the lines read before the boundary.
    L = Lines()
    recs = [L.user("a"), L.asst("msg_1", tool_use("t1")), L.asst("msg_1", tool_use("t2")),
            L.user([text("[Request interrupted by user for tool use]")]), L.result("t1", "r1"),
            _boundary(L), L.user(SUMMARY, isCompactSummary=True), L.user("after"), L.asst("msg_2", text("ok"))]
    t = read_one(write(tmp_path, recs))
    assert [m.content for m in t.messages] == ["a", "", "r1", NO_RESULT, "[Request interrupted by user for tool use]",
                                               "after", "ok"]
    assert t.meta["compactions"][0]["at"] == 5
    L = Lines()
    recs = [L.user("a"), L.asst("msg_1", tool_use("t1")), _boundary(L), L.user(SUMMARY, isCompactSummary=True),
            L.result("t1", "r1"), L.user("after")]
    t = read_one(write(tmp_path, recs, "late.jsonl"))
    assert [m.content for m in t.messages] == ["a", "", "r1", "after"]
    assert t.meta["compactions"][0]["at"] == 3


# ----------------------------------------------------------------------------- errors


def test_unreadable_lines_named_after_the_rest_is_read(tmp_path: Path) -> None:
    L = Lines()
    bad_type = L.asst("msg_2", text("x"))
    bad_type["message"]["content"] = 42
    p = tmp_path / f"{SID}.jsonl"
    p.write_text("\n".join([json.dumps(L.user("a")), "{not json", json.dumps(bad_type),
                            json.dumps(L.asst("msg_1", text("b")))]) + "\n")
    traces = []
    with pytest.raises(TraceFormatError) as e:
        for t in read_traces(p):
            traces.append(t)
    assert [m.content for m in traces[0].messages] == ["a", "b"]
    assert e.value.format == "claude-code" and e.value.path == str(p) and e.value.field == "line 2"
    assert "line 3.message.content" in str(e.value) and "2 line(s) were read" in str(e.value)


@pytest.mark.parametrize("mutate, field", [
    (lambda r: r["message"].__setitem__("content", {"text": "x"}), "line 1.message.content"),
    (lambda r: r.pop("message"), "line 1.message"),
    (lambda r: r["message"]["content"].append("text"), "line 1.message.content[1]"),
    (lambda r: r["message"]["content"][0].pop("tool_use_id"), "line 1.message.content[0].tool_use_id"),
])
def test_malformed_line_names_file_format_and_field(tmp_path: Path, mutate, field) -> None:
    rec = Lines().result("t1", "x")
    mutate(rec)
    p = write(tmp_path, [rec])
    with pytest.raises(TraceFormatError) as e:
        list(cc.read(p))
    assert (e.value.path, e.value.format, e.value.field) == (str(p), "claude-code", field)


# ----------------------------------------------------------------------------- the real sessions

# (file, tool results, compactions) from the folder's SOURCES.md table
KNOWN = [("entireio__cli__44df7d08-6bc4-4532-bef8-167ea3797cee", 226, 2),
         ("entireio__cli__08940314-9e93-46b1-a598-06bada65ed55", 303, 1),
         ("entireio__cli__a1d04b39-c7d2-47c4-aec6-d0118b0f71c6", 99, 0)]


@pytest.fixture(scope="module")
def real(sessions_dir: Path) -> dict:
    """Every Claude Code session of the shared folder, read once: file stem -> trace."""
    folder = sessions_dir / "claude-code"
    out = {}
    for t in read_traces(folder):
        out[Path(t.path).name.removesuffix(".jsonl.gz")] = t
    assert len(out) == 40
    return out


def _table(sessions_dir: Path) -> dict[str, tuple[int, int]]:
    """SOURCES.md's claude-code rows: stem -> (tool results, compactions)."""
    rows = {}
    for line in (sessions_dir / "SOURCES.md").read_text().splitlines():
        if line.startswith("| claude-code/"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0].removeprefix("claude-code/").removesuffix(".jsonl.gz")] = (int(cells[7]), int(cells[8]))
    return rows


def test_real_sessions_read_and_paired(real: dict, sessions_dir: Path) -> None:
    for stem, t in real.items():
        assert t.source == "claude-code" and stem.endswith(t.trace_id) and t.meta["session_id"] == t.trace_id
        ms = t.messages
        for i, m in enumerate(ms):
            if m.role == "tool":
                j = i - 1
                while ms[j].role == "tool":
                    j -= 1
                assert m.tool_call_id in {c.id for c in ms[j].tool_calls}, (stem, i)
        answered = {m.tool_call_id for m in ms if m.role == "tool"}
        last = max(i for i, m in enumerate(ms) if m.role == "assistant")
        assert all(c.id in answered for i, m in enumerate(ms[:last]) for c in m.tool_calls), stem
        assert t.meta["orphan_results"] == 0 and t.meta["renamed_call_ids"] == 0
    assert detect_format(next(iter(sorted((sessions_dir / "claude-code").iterdir())))) == "claude-code"


@pytest.mark.parametrize("stem, results, compactions", KNOWN)
def test_real_counts_of_known_files(real: dict, stem: str, results: int, compactions: int) -> None:
    t = real[stem]
    assert len(t.meta["compactions"]) == compactions
    assert sum(m.role == "tool" and m.content != NO_RESULT for m in t.messages) == results


def test_real_counts_match_the_sources_table(real: dict, sessions_dir: Path) -> None:
    # Every recorded tool_result block becomes a tool message (the table counts those blocks); the
    # calls a user interrupted have no recorded result and get the synthetic one on top.
    table = _table(sessions_dir)
    assert set(table) == set(real)
    synthetic = 0
    for stem, t in real.items():
        tools = [m for m in t.messages if m.role == "tool"]
        assert (sum(m.content != NO_RESULT for m in tools), len(t.meta["compactions"])) == table[stem], stem
        synthetic += t.meta["synthetic_results"]
    assert sum(r for r, _ in table.values()) == 6267 and synthetic == 8


def test_real_usage_one_entry_per_assistant_message(real: dict) -> None:
    for stem, t in real.items():
        assistants = [i for i, m in enumerate(t.messages) if m.role == "assistant"]
        assert [u["message"] for u in t.meta["usage"]] == assistants, stem
        for u in t.meta["usage"]:
            assert u["input"] + u["cache_read"] + u["cache_write"] > 0 and u["output"] >= 1, (stem, u)
            assert u["model"].startswith("claude-") and u["timestamp"] > 1.7e9
        assert all(t.messages[int(k)].role == "assistant" and all(b["type"] == "thinking" for b in v)
                   for k, v in t.meta["reasoning"].items())


def test_real_compactions(real: dict) -> None:
    total = 0
    for stem, t in real.items():
        for c in t.meta["compactions"]:
            total += 1
            # an auto compaction goes on with a reply to the summary, a manual one with the user's prompt
            assert 0 < c["at"] < len(t.messages) and t.messages[c["at"]].role != "tool", stem
            (kept,) = c["kept"]
            assert kept["role"] == "user" and kept["content"].startswith("This session is being continued")
            assert kept["content"] not in {m.content for m in t.messages}
            assert c["trigger"] in ("auto", "manual") and c["pre_tokens"] > 100_000
            # the first call after it sent far less than the compacted context
            first = next(u for u in t.meta["usage"] if u["message"] >= c["at"])
            assert first["input"] + first["cache_read"] + first["cache_write"] < c["pre_tokens"]
    assert total == 35


def test_real_skipped_lines(real: dict) -> None:
    total: dict[str, int] = {}
    for t in real.values():
        for k, v in t.meta["skipped_lines"].items():
            total[k] = total.get(k, 0) + v
    # meta: the 20 local-command caveats (the 28 other isMeta lines, 17 command bodies and 11 skill
    # bodies, are user turns); command: 51 tag-only lines less the 17 whose body followed them
    assert total == {"progress": 10067, "file-history-snapshot": 831, "system": 717, "queue-operation": 94,
                     "summary": 46, "pr-link": 6, "meta": 20, "command": 34, "synthetic": 12, "duplicate_uuid": 1}
    # the one pasted image of the set reaches the message as media
    assert sum(bool(m.media) for t in real.values() for m in t.messages) == 1


def test_real_session_opened_by_a_slash_command_starts_with_it(real: dict) -> None:
    # Read by hand from the log: line 2 is the command typed by the user, line 3 (isMeta, its child)
    # the command's body, line 4 the first reply, billed 2 + 22033 + 21605 input tokens.
    t = real["entireio__cli__847ff7d2-4a55-44d7-a3f5-a3afd89f1ee1"]
    first = t.messages[0]
    assert first.role == "user" and first.content.startswith(
        "<command-message>workflows:review</command-message>\n<command-name>/workflows:review</command-name>\n"
        "<command-args>https://github.com/entireio/cli/pull/2</command-args>\n# Review Command\n\n<command_purpose> "
        "Perform exhaustive code reviews using multi-agent analysis, ultra-thinking, and Git worktrees")
    assert t.meta["usage"][0]["message"] == 1 and t.meta["usage"][0]["cache_write"] == 21605
    assert "meta" not in t.meta["skipped_lines"] and "command" not in t.meta["skipped_lines"]
    # A session with prompt commands, Skill-tool bodies and one local command (/ide, line 116, after
    # its caveat, line 115, and before its stdout, line 117): the caveat is the one meta line
    # skipped, /ide and its stdout the two command lines; the three skill bodies loaded by the tool
    # (lines 8, 177, 531) are user messages of their own.
    t = real["entireio__cli__062a8bdd-4322-4ffa-bc38-3e8b8bfb5a56"]
    assert (t.meta["skipped_lines"]["meta"], t.meta["skipped_lines"]["command"]) == (1, 2)
    assert t.messages[0].content == ("<command-message>superpowers:brainstorm</command-message>\n"
                                     "<command-name>/superpowers:brainstorm</command-name>\n"
                                     "Invoke the superpowers:brainstorming skill and follow it exactly as presented to you\n")
    assert sum(m.role == "user" and m.content.startswith("Base directory for this skill:") for m in t.messages) == 3


def test_a_file_with_no_readable_line_yields_no_trace(tmp_path: Path) -> None:
    p = tmp_path / f"{SID}.jsonl.gz"
    p.write_bytes(b"not gzip at all")
    got = []
    with pytest.raises(TraceFormatError) as e:
        for t in cc.read(p):
            got.append(t)
    assert got == [] and e.value.field is None and "cannot be read" in str(e.value)


def test_a_gz_file_cut_short_is_read_up_to_where_it_ends(sessions_dir: Path, tmp_path: Path) -> None:
    """A log copied while the agent was writing it: the lines before the cut are a trace, and the
    error names where the file stops being readable."""
    src = sessions_dir / "claude-code" / "entireio__cli__a1d04b39-c7d2-47c4-aec6-d0118b0f71c6.jsonl.gz"
    p = tmp_path / "cut.jsonl.gz"
    p.write_bytes(src.read_bytes()[:60_000])
    got = []
    with pytest.raises(TraceFormatError) as e:
        for t in cc.read(p):
            got.append(t)
    assert len(got) == 1 and got[0].messages
    assert e.value.field is not None and e.value.field.endswith("to the end") and "cut short" in str(e.value)
