"""Trace readers (historygraph.traces) against the real development traces and malformed input.

The expected counts below were computed independently of the reader code, with ``jq`` over the
raw files in shared/traces (the exact command is quoted next to each number) plus the mapping
rules stated in the brief (e.g. SWE-agent v0.x: every user message after the first assistant
message is a tool result; OpenHands: recall observation -> user message).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from historygraph.traces import READERS, TraceFormatError, detect_format, list_trace_files, read_traces

FORMATS = ("mini-swe-agent", "swe-agent", "openhands", "tau-bench", "tau2-bench", "claude-code", "codex", "openai-chat")


def roles(trace) -> dict[str, int]:
    return dict(Counter(m.role for m in trace.messages))


def n_calls(trace) -> int:
    return sum(len(m.tool_calls) for m in trace.messages)


def n_results(trace) -> int:
    return sum(m.role == "tool" for m in trace.messages)


def assert_paired(trace) -> None:
    """Pairing guarantee, checked from scratch: tool messages come right after the assistant
    message whose call they answer, one per call, call ids unique in the trace; every call is
    answered except (possibly) those of the trace's final assistant message."""
    msgs = trace.messages
    ids = [c.id for m in msgs for c in m.tool_calls]
    assert len(ids) == len(set(ids)), f"{trace.trace_id}: duplicate call ids"
    last_assistant = max((i for i, m in enumerate(msgs) if m.role == "assistant"), default=-1)
    i = 0
    while i < len(msgs):
        m = msgs[i]
        assert m.role != "tool", f"{trace.trace_id}: message {i} is a tool result not right after its call"
        if m.role == "assistant" and m.tool_calls:
            j, got = i + 1, []
            while j < len(msgs) and msgs[j].role == "tool":
                got.append(msgs[j].tool_call_id)
                j += 1
            want = [c.id for c in m.tool_calls]
            assert len(got) == len(set(got)) and set(got) <= set(want), f"{trace.trace_id}: message {i}"
            if i != last_assistant:
                assert sorted(got) == sorted(want), f"{trace.trace_id}: unanswered call at message {i}"
            i = j
        else:
            i += 1


# ----------------------------------------------------------------------------- real traces


def test_lists_27_files_and_skips_others(traces_dir: Path) -> None:
    files = list_trace_files(traces_dir)
    assert len(files) == 27
    names = {f.name for f in files}
    assert "SOURCES.md" not in names and "MANIFEST.tsv" not in names
    assert files == sorted(files, key=lambda f: f.relative_to(traces_dir).as_posix())


@pytest.mark.parametrize(
    "rel, fmt",
    [
        ("mini-swe-agent-deepseek/astropy__astropy-12907.traj.json", "mini-swe-agent"),
        ("swe-agent/pydicom__pydicom-1458.traj", "swe-agent"),
        ("swe-agent/marshmallow-code__marshmallow-1867.traj", "swe-agent"),
        ("openhands/multi_swe_bench_examples/output.jsonl", "openhands"),
        ("openhands/resolver_mock_output/output.jsonl", "openhands"),
        ("openhands/basic_gui_mode.json", "openhands"),
        ("tau-bench/gpt-4o-airline.json", "tau-bench"),
        ("tau2-bench/gpt-4.1_retail_defautl_gpt-4.1_1trials.json", "tau2-bench"),
    ],
)
def test_detect_format(traces_dir: Path, rel: str, fmt: str) -> None:
    assert detect_format(traces_dir / rel) == fmt


def test_every_file_detected_and_every_trajectory_paired(traces_dir: Path) -> None:
    per_format: Counter[str] = Counter()
    total = 0
    for f in list_trace_files(traces_dir):
        fmt = detect_format(f)
        for tr in read_traces(f):
            assert tr.source == fmt
            assert_paired(tr)
            per_format[fmt] += 1
            total += 1
    assert total == 287
    # SOURCES.md: 14 mini-swe-agent, 7 SWE-agent, 3 + 2 + 1 OpenHands, 200 tau-bench, 20 + 40 tau2-bench.
    assert per_format == {"mini-swe-agent": 14, "swe-agent": 7, "openhands": 6, "tau-bench": 200, "tau2-bench": 60}


def test_directory_read_totals_287(traces_dir: Path) -> None:
    traces = list(read_traces(traces_dir))
    assert len(traces) == 287
    # trace ids are unique within each file
    by_file = Counter((t.path, t.trace_id) for t in traces)
    assert max(by_file.values()) == 1


def test_mini_swe_agent_counts(traces_dir: Path) -> None:
    (tr,) = read_traces(traces_dir / "mini-swe-agent-deepseek/astropy__astropy-12907.traj.json")
    # jq -c '[.messages[]|.role]|group_by(.)|map({(.[0]):length})|add'
    #   -> {"assistant":36,"exit":1,"system":1,"tool":35,"user":1}; the exit message is dropped.
    # jq '[.messages[]|.tool_calls[]?]|length' -> 36 (the last one, submit, has no result).
    assert tr.trace_id == "astropy__astropy-12907"
    assert roles(tr) == {"system": 1, "user": 1, "assistant": 36, "tool": 35}
    assert n_calls(tr) == 36 and n_results(tr) == 35
    assert tr.meta["unanswered_final_calls"] == 1
    assert tr.meta["model"] == "deepseek/deepseek-chat"
    assert all(m.timestamp is not None for m in tr.messages if m.role in ("assistant", "tool"))


def test_mini_swe_agent_ignores_raw_response(traces_dir: Path) -> None:
    path = traces_dir / "mini-swe-agent-deepseek/django__django-15388.traj.json"
    (tr,) = read_traces(path)
    seen = sum(len(m.content) + sum(len(c.arguments) for c in m.tool_calls) for m in tr.messages)
    # SOURCES.md: files are ~3x the text the model saw because extra.response repeats it.
    assert seen < path.stat().st_size / 2
    raw = json.loads(path.read_text())
    response_ids = {m["extra"]["response"]["id"] for m in raw["messages"] if "response" in m.get("extra", {})}
    assert response_ids and not any(rid in m.content for m in tr.messages for rid in response_ids)


def test_swe_agent_old_format_with_demo(traces_dir: Path) -> None:
    (tr,) = read_traces(traces_dir / "swe-agent/pydicom__pydicom-1458.traj")
    # jq '[.history[]|select(.is_demo)]|length' -> 1
    # jq -c '[.history[]|select(.is_demo|not)|.role]|group_by(.)|map({(.[0]):length})|add'
    #   -> {"assistant":12,"system":1,"user":12}
    # user messages after the first assistant (observations):
    # jq '[.history[]|select(.is_demo|not)] | (map(.role)|index("assistant")) as $fa
    #     | [.[$fa:][]|select(.role=="user")]|length' -> 11
    # assistant messages with an action: 12 (the last, "submit", is the final message).
    assert tr.trace_id == "pydicom__pydicom-1458"
    assert roles(tr) == {"system": 1, "user": 1, "assistant": 12, "tool": 11}
    assert n_calls(tr) == 12 and n_results(tr) == 11
    assert tr.meta["demo_messages"] == 1
    assert "--- DEMONSTRATION ---" in tr.messages[0].content and "\n\nHere is a demonstration" in tr.messages[0].content
    first = tr.messages[2]
    assert first.tool_calls[0].id == "pydicom__pydicom-1458-call-1"
    assert first.tool_calls[0].name == "bash"
    assert json.loads(first.tool_calls[0].arguments) == {"command": "create reproduce_bug.py\n"}
    assert "```" not in first.content  # the thought, not the content with the action block


def test_swe_agent_tool_call_format(traces_dir: Path) -> None:
    (tr,) = read_traces(traces_dir / "swe-agent/marshmallow-code__marshmallow-1867.traj")
    # jq -c '[.history[]|.role]|group_by(.)|map({(.[0]):length})|add'
    #   -> {"assistant":11,"system":1,"tool":11,"user":1}
    # jq '[.history[]|.tool_calls[]?]|length' -> 11; '[.history[]|.tool_call_ids[]?]|length' -> 11
    # The recorded ids repeat (call_5iDd… x4, call_ahTo… x2, call_q3Vs… x2): 5 renames.
    assert roles(tr) == {"system": 1, "user": 1, "assistant": 11, "tool": 11}
    assert n_calls(tr) == 11 and n_results(tr) == 11
    assert tr.meta["renamed_call_ids"] == 5 and tr.meta["demo_messages"] == 0


def test_openhands_counts(traces_dir: Path) -> None:
    traces = list(read_traces(traces_dir / "openhands/multi_swe_bench_examples/output.jsonl"))
    # wc -l -> 3 lines, one run each
    assert [t.trace_id for t in traces] == ["ponylang__ponyc-4595", "ponylang__ponyc-4593", "ponylang__ponyc-4588"]
    tr = traces[0]
    # head -1 output.jsonl | jq over .history:
    #   action=="system" -> 1; action=="message" and source=="user" -> 1; observation=="recall" -> 1;
    #   actions with tool_call_metadata -> 23, distinct model_response ids -> 23;
    #   agent message actions -> 0; observations with cause and tool_call_metadata -> 22;
    #   observation=="error" -> 0.
    assert roles(tr) == {"system": 1, "user": 2, "assistant": 23, "tool": 22}
    assert n_calls(tr) == 23 and n_results(tr) == 22
    assert tr.meta["recall_messages"] == 1
    # run 2 has one cause-less error observation (event id 29), kept as a user message
    assert traces[1].meta["error_observations"] == 1
    assert all(m.timestamp is not None for m in tr.messages)


def test_openhands_old_resolver_and_bare_list(traces_dir: Path) -> None:
    old = list(read_traces(traces_dir / "openhands/resolver_mock_output/output.jsonl"))
    # jq -c '[.issue.number, (.history|length)]' -> [5,8] and [1,44]
    assert [t.trace_id for t in old] == ["issue-5", "issue-1"]
    # issue 5: message, run, obs, run_ipython, obs, run, obs, finish
    assert roles(old[0]) == {"user": 1, "assistant": 4, "tool": 3}
    assert old[0].messages[1].tool_calls[0].id == "issue-5-call-1"
    (gui,) = read_traces(traces_dir / "openhands/basic_gui_mode.json")
    # jq: 1 user message, 4 agent actions with tool_call_metadata, 4 observations answering them,
    # 1 agent message; the rest are agent_state_changed / null events.
    assert gui.trace_id == "basic_gui_mode"
    assert roles(gui) == {"user": 1, "assistant": 5, "tool": 4}
    assert n_calls(gui) == 4
    args = json.loads(gui.messages[3].tool_calls[0].arguments)
    assert args["command"] == "create" and args["file_text"].startswith("<!DOCTYPE html>")


def test_tau_bench_counts(traces_dir: Path) -> None:
    traces = list(read_traces(traces_dir / "tau-bench/gpt-4o-airline.json"))
    assert len(traces) == 200  # jq 'length' -> 200
    tr = traces[0]
    # jq -c '.[0]|[.task_id,.trial]' -> [0,0]
    # jq -c '.[0]|[.traj[]|.role]|group_by(.)|map({(.[0]):length})|add'
    #   -> {"assistant":15,"system":1,"tool":8,"user":8}; '[.[0].traj[]|.tool_calls[]?]|length' -> 8
    assert tr.trace_id == "task0-trial0"
    assert roles(tr) == {"system": 1, "user": 8, "assistant": 15, "tool": 8}
    assert n_calls(tr) == 8 and n_results(tr) == 8
    # call_HGn16… and call_oIHaz… are each used twice in this run
    assert tr.meta["renamed_call_ids"] == 2
    assert sum(len(t.messages) for t in traces) == 5308  # jq '[.[]|.traj[]]|length' -> 5308


def test_tau2_bench_counts(traces_dir: Path) -> None:
    traces = list(read_traces(traces_dir / "tau2-bench/gpt-4.1_airline_default_gpt-4.1_1trials.json"))
    assert len(traces) == 20  # jq '.simulations|length' -> 20
    tr = traces[0]
    # jq -c '.simulations[0]|.id, ([.messages[]|.role]|group_by(.)|map({(.[0]):length})|add)'
    #   -> "b762699f-…", {"assistant":9,"tool":3,"user":6}; tool calls -> 3.
    # Plus one system message (info.environment_info.policy).
    assert tr.trace_id == "b762699f-cf72-4a2f-b500-5bbe1258209c"
    assert roles(tr) == {"system": 1, "assistant": 9, "user": 6, "tool": 3}
    assert n_calls(tr) == 3 and n_results(tr) == 3
    assert tr.messages[0].content.startswith("# Airline Agent Policy")
    # jq '[.simulations[].messages[]|.tool_calls[]?|select(.requestor=="user")]|length' -> 0 in both files
    assert all(t.meta["user_tool_calls"] == 0 for t in read_traces(traces_dir / "tau2-bench"))


# ----------------------------------------------------------------------------- repairs


def test_pairing_repairs(tmp_path: Path) -> None:
    def call(i, name="f"):
        return {"id": i, "type": "function", "function": {"name": name, "arguments": "{}"}}

    traj = [
        {"role": "system", "content": "s"},
        {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")]},
        {"role": "tool", "tool_call_id": "a", "content": "ra"},  # b never answered
        {"role": "user", "content": "u"},
        {"role": "tool", "tool_call_id": "zzz", "content": "stray"},  # no such call
        {"role": "assistant", "content": None, "tool_calls": [call("a")]},  # duplicate id
        {"role": "tool", "tool_call_id": "a", "content": "ra2"},
        {"role": "assistant", "content": None, "tool_calls": [call("c")]},  # final, unanswered
    ]
    p = tmp_path / "t.json"
    p.write_text(json.dumps([{"task_id": 7, "trial": 1, "traj": traj}]))
    (tr,) = read_traces(p)
    assert tr.trace_id == "task7-trial1"
    assert_paired(tr)
    got = [(m.role, m.content, m.tool_call_id, tuple(c.id for c in m.tool_calls)) for m in tr.messages]
    assert got == [
        ("system", "s", None, ()),
        ("assistant", "", None, ("a", "b")),
        ("tool", "ra", "a", ()),
        ("tool", "[no result was recorded for this call]", "b", ()),
        ("user", "u", None, ()),
        ("user", "[tool result without a recorded call] stray", None, ()),
        ("assistant", "", None, ("a#2",)),
        ("tool", "ra2", "a#2", ()),
        ("assistant", "", None, ("c",)),
    ]
    assert tr.meta["synthetic_results"] == 1 and tr.meta["orphan_results"] == 1
    assert tr.meta["renamed_call_ids"] == 1 and tr.meta["unanswered_final_calls"] == 1


def test_openhands_parallel_calls_share_one_message(tmp_path: Path) -> None:
    def act(i, cid):
        return {"id": i, "source": "agent", "action": "run", "args": {"command": f"echo {i}", "thought": f"t{i}"},
                "tool_call_metadata": {"function_name": "execute_bash", "tool_call_id": cid,
                                       "total_calls_in_response": 2, "model_response": {"id": "resp-1"}}}

    def obs(i, cause):
        return {"id": i, "source": "agent", "observation": "run", "cause": cause, "content": f"out{cause}",
                "extras": {}}

    events = [{"id": 0, "source": "user", "action": "message", "args": {"content": "go"}},
              act(1, "c1"), obs(2, 1), act(3, "c2"), obs(4, 3),
              {"id": 5, "source": "agent", "action": "message", "args": {"content": "done"}}]
    p = tmp_path / "events.json"
    p.write_text(json.dumps(events))
    (tr,) = read_traces(p)
    assert_paired(tr)
    assert [m.role for m in tr.messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [c.id for c in tr.messages[1].tool_calls] == ["c1", "c2"]
    assert tr.messages[1].content == "t1\nt3"
    assert json.loads(tr.messages[1].tool_calls[1].arguments) == {"command": "echo 3"}


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "name, body, fmt, field",
    [
        ("a.traj", "{not json", "swe-agent", None),
        ("m.traj.json", json.dumps({"trajectory_format": "mini-swe-agent-1.1", "instance_id": "x"}),
         "mini-swe-agent", "messages"),
        ("m2.traj.json",
         json.dumps({"trajectory_format": "mini-swe-agent-1.1", "instance_id": "x", "messages": ["hi"]}),
         "mini-swe-agent", "messages[0]"),
        ("s.json", json.dumps({"simulations": [{"task_id": "1", "messages": [
            {"role": "assistant", "content": "x", "tool_calls": [{"id": "c1", "arguments": {}}]}]}]}),
         "tau2-bench", "simulations[0].messages[0].tool_calls[0]"),
        ("t.json", json.dumps([{"task_id": 1, "trial": 0, "traj": [{"role": "tool", "content": "x"}]}]),
         "tau-bench", "[0].traj[0].tool_call_id"),
        ("t2.json", json.dumps([{"task_id": 1, "trial": 0, "traj": "nope"}]), "tau-bench", "[0].traj"),
        ("o.jsonl", json.dumps({"instance_id": "i", "history": []}) + "\n{broken\n", "openhands", "line 2"),
        ("w.traj", json.dumps({"history": [{"content": "x"}], "trajectory": []}), "swe-agent", "history[0].role"),
    ],
)
def test_malformed_file_names_file_format_field(tmp_path: Path, name, body, fmt, field) -> None:
    p = tmp_path / name
    p.write_text(body)
    with pytest.raises(TraceFormatError) as exc:
        list(read_traces(p, format=fmt if field is None else None))
    e = exc.value
    assert (e.path, e.format, e.field) == (str(p), fmt, field)
    assert str(e).startswith(f"{p}: format {fmt}: field {field}: " if field else f"{p}: format {fmt}: not valid JSON: ")


def test_unknown_shape_names_formats_tried(tmp_path: Path) -> None:
    p = tmp_path / "weird.json"
    p.write_text(json.dumps({"foo": 1}))
    with pytest.raises(TraceFormatError) as exc:
        detect_format(p)
    msg = str(exc.value)
    assert str(p) in msg and all(f in msg for f in FORMATS)
    with pytest.raises(TraceFormatError):
        list(read_traces(tmp_path))
    assert set(READERS) == set(FORMATS)


def test_bad_json_without_format_is_trace_format_error(tmp_path: Path) -> None:
    p = tmp_path / "bad.json"
    p.write_text("[1, 2")
    with pytest.raises(TraceFormatError) as exc:
        list(read_traces(p))
    assert str(p) in str(exc.value) and "not valid JSON" in str(exc.value)


# ----------------------------------------------------------------------------- public variants


def _opendevin_line(with_ids: bool) -> dict:
    """A hand-made 2024 OpenDevin ``output.jsonl`` record: ``history`` of [action, observation] pairs
    (OpenDevin's ``(action.to_dict(), observation.to_dict())``), the task only in ``instruction``."""
    def ids(d, i, cause=None):
        if with_ids:
            d = {**d, "id": i, "source": "agent", "timestamp": "2024-06-01T10:00:0%d" % (i % 10)}
            if cause is not None:
                d["cause"] = cause
        return d

    history = [
        [ids({"action": "run", "args": {"command": "ls", "background": False, "thought": "Look around."},
              "message": "Running command: ls"}, 1),
         ids({"observation": "run", "content": "setup.py\nsrc", "extras": {"command_id": -1, "command": "ls", "exit_code": 0},
              "message": "Command `ls` executed with exit code 0."}, 2, cause=1)],
        [ids({"action": "read", "args": {"path": "setup.py", "start": 0, "end": -1, "thought": ""}, "message": "Reading"}, 3),
         ids({"observation": "read", "content": "from setuptools import setup", "extras": {"path": "setup.py"},
              "message": "read"}, 4, cause=3)],
        [ids({"action": "message", "args": {"content": "Done, see setup.py", "wait_for_response": False},
              "message": "Done"}, 5),
         {"observation": "null", "content": "", "extras": {}, "message": "No observation"}],
        [ids({"action": "finish", "args": {"outputs": {}, "thought": "Finished."}, "message": "All done"}, 6),
         {"observation": "null", "content": "", "extras": {}, "message": "No observation"}],
    ]
    return {"instance_id": "django__django-1", "instruction": "Fix the bug in setup.py", "history": history,
            "metadata": {"agent_class": "CodeActAgent", "model_name": "gpt-4o-2024-05-13"}, "error": None,
            "test_result": {"git_patch": ""}}


@pytest.mark.parametrize("with_ids", [True, False], ids=["with-ids", "without-ids"])
def test_opendevin_2024_history_of_action_observation_pairs(tmp_path: Path, with_ids: bool) -> None:
    f = tmp_path / "output.jsonl"
    f.write_text(json.dumps(_opendevin_line(with_ids)) + "\n")
    assert detect_format(f) == "openhands"
    (tr,) = read_traces(f)
    assert tr.trace_id == "django__django-1" and tr.meta["event_format"] == "pairs"
    # the instruction (user), run + result, read + result, the agent's message, finish (plain assistant)
    assert [(m.role, m.content) for m in tr.messages] == [
        ("user", "Fix the bug in setup.py"),
        ("assistant", "Look around."), ("tool", "setup.py\nsrc"),
        ("assistant", ""), ("tool", "from setuptools import setup"),
        ("assistant", "Done, see setup.py"), ("assistant", "Finished.")]
    run, read = tr.messages[1].tool_calls[0], tr.messages[3].tool_calls[0]
    assert (run.name, json.loads(run.arguments)) == ("execute_bash", {"command": "ls", "background": False})
    assert (read.name, json.loads(read.arguments)) == ("read", {"path": "setup.py", "start": 0, "end": -1})
    assert tr.messages[2].tool_call_id == run.id and tr.messages[4].tool_call_id == read.id
    assert_paired(tr)


def test_tau2_bench_submission_without_task_ids(tmp_path: Path) -> None:
    sims = [{"id": "sim-a", "trial": 0, "termination_reason": "agent_stop", "reward_info": {"reward": 1.0},
             "messages": [
                 {"role": "assistant", "content": "Hi! How can I help you today?"},
                 {"role": "user", "content": "Cancel reservation EHGLP3"},
                 {"role": "assistant", "content": None, "tool_calls": [
                     {"id": "c1", "name": "get_reservation_details", "arguments": {"reservation_id": "EHGLP3"}, "requestor": "assistant"}]},
                 {"role": "tool", "id": "c1", "content": "{\"status\": \"active\"}", "requestor": "assistant"},
                 {"role": "assistant", "content": "It is active."}]},
            {"trial": 1, "termination_reason": "user_stop", "messages": [{"role": "user", "content": "bye"}]}]
    f = tmp_path / "submission.json"
    f.write_text(json.dumps({"timestamp": "2025-07-01", "info": {"agent_info": {"llm": "my-model"}}, "simulations": sims}))
    a, b = read_traces(f)
    assert (a.trace_id, a.meta["task_id"], a.meta["reward"]) == ("sim-a", None, 1.0)
    assert [m.role for m in a.messages] == ["assistant", "user", "assistant", "tool", "assistant"]
    assert json.loads(a.messages[2].tool_calls[0].arguments) == {"reservation_id": "EHGLP3"}
    assert b.trace_id == "simulation1-trial1"
    bare = tmp_path / "bare.json"  # a bare list of such simulations is detected too
    bare.write_text(json.dumps(sims))
    assert detect_format(bare) == "tau2-bench" and len(list(read_traces(bare))) == 2


def test_a_forced_format_that_does_not_fit_names_the_one_the_file_reads_as(tmp_path: Path) -> None:
    p = tmp_path / "output.jsonl"
    run = {"instance_id": "i", "history": [{"id": 0, "source": "user", "action": "message", "args": {"content": "t"}}]}
    p.write_text(json.dumps(run) + "\n" + json.dumps(run) + "\n")
    with pytest.raises(TraceFormatError) as exc:
        list(read_traces(p, format="tau-bench"))
    assert "not valid JSON" in str(exc.value) and str(exc.value).endswith(
        "(the file reads as format openhands: leave the format out, or give openhands)")
    assert [t.trace_id for t in read_traces(p, format="openhands")] == ["i", "i"]
