"""Later-Used Result Recall (ContextRender B.4) on tiny transcripts with hand-labelled events."""

from historygraph.history.events import Message, ToolCall
from historygraph.eval.recall import ReuseEvent, age_bin, recall_tokens, reuse_events
from historygraph.eval.replay import replay_trace
from historygraph.history.events import Trace
from historygraph.policies import Signals, create


def call(cid, args="{}"):
    return ToolCall(cid, "t", args)


def test_recall_token_rule_differs_from_tfa():
    # Titlecase words qualify; hyphens, periods and @ split (ORD, 7781, gmail, com are too short or lack
    # an uppercase letter or underscore); lowercase-only tokens and x_y (3 chars) do not.
    assert recall_tokens("Kathryn tr_solo@gmail.com ORD-7781 lowercase PATH_TO x_y") == {"Kathryn", "tr_solo", "PATH_TO"}


def test_events_first_appearance_and_pairs():
    msgs = [
        Message("user", "Find Kathryn's ticket"),                        # 0: Kathryn first seen in the task
        Message("assistant", "", (call("c1"),)),                          # 1: turn 1
        Message("tool", "Kathryn TICKET_9 Alpha_1 Alpha_2", tool_call_id="c1"),  # 2: TICKET_9 etc. first seen here
        Message("assistant", "TICKET_9 Alpha_1 Kathryn", (call("c2", '{"t": "Alpha_2"}'),)),  # 3: turn 2
        Message("tool", "NEWVAL_1 TICKET_9", tool_call_id="c2"),          # 4
        Message("assistant", "NEWVAL_1"),                                # 5: turn 3
        Message("user", "and TICKET_9?"),                                # 6
        Message("assistant", "TICKET_9 NEWVAL_1"),                       # 7: turn 4
    ]
    # (3, 2): three tokens of result 2 but one event; Kathryn is linked to nothing (first seen in the task).
    # (5, 4): NEWVAL_1; (7, 2) TICKET_9 and (7, 4) NEWVAL_1. Ages: turns before j minus turns at r.
    assert reuse_events(msgs) == [
        ReuseEvent(turn=3, result=2, age=0),
        ReuseEvent(turn=5, result=4, age=0),
        ReuseEvent(turn=7, result=2, age=2),
        ReuseEvent(turn=7, result=4, age=1),
    ]


def test_age_bins_of_table_2():
    assert [age_bin(a) for a in (0, 3, 4, 10, 11, 25, 26)] == ["<=3", "<=3", "4-10", "4-10", "11-25", "11-25", ">25"]


def test_replay_counts_visible_results_only():
    big = "filler words " * 400
    msgs = [
        Message("user", "task"),
        Message("assistant", "", (call("c1"),)),
        Message("tool", "KEY_AAAA " + big, tool_call_id="c1"),
        Message("assistant", "", (call("c2"),)),
        Message("tool", "KEY_BBBB " + big, tool_call_id="c2"),
        Message("assistant", "KEY_AAAA KEY_BBBB"),
    ]
    tr = Trace("test", "t1", "mem", msgs)
    sig = Signals()
    # Prune at a budget that holds only the newest result: event (5, 4) is a hit, (5, 2) a miss.
    res = replay_trace(tr, {"prune": create("prune"), "full": create("full")}, 1000, sig)
    assert (res.stats["prune"].events, res.stats["prune"].hits) == (2, 1)
    assert (res.stats["full"].events, res.stats["full"].hits) == (2, 2)
    assert res.stats["prune"].by_age["<=3"] == [2, 1]
    assert max(res.stats["prune"].history_tokens) <= 1000
    assert res.stats["prune"].violations == []
