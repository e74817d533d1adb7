"""Repeated-read exposure and the share of old full observations (ContextWeaver §5.5)."""

import json

from historygraph.eval.replay import replay_trace
from historygraph.eval.steps_metrics import StepsCounts, read_key
from historygraph.history.events import Message, ToolCall, Trace
from historygraph.history.graph import ContextGraph
from historygraph.policies import Signals, create


def bash(cid, command):
    return ToolCall(cid, "bash", json.dumps({"command": command}))


def test_read_commands_are_recognised_and_normalised():
    assert read_key(bash("a", "cd /repo && cat  src/a.py")) == "bash: cat src/a.py"
    assert read_key(bash("b", "cat src/a.py")) == "bash: cat src/a.py"
    assert read_key(bash("c", "sed -n 1,20p a.py")) == "bash: sed -n 1,20p a.py"
    assert read_key(bash("d", "sed -i s/a/b/ a.py")) is None
    assert read_key(bash("e", "python reproduce.py")) is None
    view = ToolCall("f", "str_replace_editor", json.dumps({"command": "view", "path": "/r/a.py"}))
    assert read_key(view) == "str_replace_editor view /r/a.py None"
    assert read_key(ToolCall("g", "str_replace_editor", json.dumps({"command": "create", "path": "x"}))) is None
    assert read_key(ToolCall("h", "bash", "not json")) is None


def test_repeated_reads_count_only_when_the_earlier_result_was_omitted():
    g = ContextGraph("m", [Message("user", "task")])
    for k, cmd in enumerate(["cat a.py", "grep -n x b.py", "echo hi"]):
        g.append(Message("assistant", "", (bash(f"c{k}", cmd),)))
        g.append(Message("tool", f"out {k}", tool_call_id=f"c{k}"))
    turn = Message("assistant", "", (bash("n1", "cd /repo && cat a.py"), bash("n2", "grep  -n x  b.py"),
                                     bash("n3", "sed -n 1,5p c.py"), bash("n4", "echo hi")))
    c = StepsCounts()
    c.observe(g, {g.result_of["c1"]}, turn)
    assert (c.read_repeats, c.read_repeats_exposed) == (2, 1)  # cat a.py was omitted, grep was shown


def test_old_full_share_counts_ages_beyond_the_recent_steps():
    g = ContextGraph("m", [Message("user", "task")])
    for k in range(9):  # the result of step k has age 8 − k; step 3's result is short
        g.append(Message("assistant", "", (bash(f"c{k}", f"echo {k}"),)))
        g.append(Message("tool", f"out {k}" * (1 if k == 3 else 100), tool_call_id=f"c{k}"))
    shown = {g.result_of[f"c{k}"] for k in (0, 1, 3, 4, 6, 7, 8)}  # ages 8, 7, 5 (short), 4, 2, 1, 0
    c = StepsCounts()
    c.observe(g, shown, Message("assistant", "done"))
    assert (c.full_beyond_recent, c.full_old) == (3, 2)
    assert c.columns()["old_full_share"] == 66.67
    c.observe(g, set(g.result_of.values()), Message("assistant", "done"))  # nothing omitted: not counted
    assert (c.full_beyond_recent, c.full_old) == (3, 2)


def test_replay_records_the_metrics_per_policy():
    msgs = [Message("user", "task")]
    for k, cmd in enumerate(["cat a.py", "echo x", "cat a.py"]):
        msgs += [Message("assistant", "", (bash(f"c{k}", cmd),)), Message("tool", "data " * 400 + str(k), tool_call_id=f"c{k}")]
    msgs.append(Message("assistant", "done"))
    res = replay_trace(Trace("t", "t1", "mem", msgs), {"prune": create("prune")}, 700, Signals())
    # before turn 3 (the second cat a.py) prune keeps only the newest result, so the first read was omitted
    assert res.stats["prune"].steps.read_repeats == 1 and res.stats["prune"].steps.read_repeats_exposed == 1
