"""The library renders cache-stable by default, with or without a store (issue 49 item 1):
``render_messages`` without ``session=``/``store=`` keeps the graphs of the conversations it
rendered last (``historygraph.api.RECENT``), so a conversation's next call extends its previous
rendering; a ``Session`` (in-memory store by default) does the same; a policy instance re-selects
at every call."""

from __future__ import annotations

import json

from historygraph import Session, create, render_messages

B = 4000


def step(k: int, tag: str = "a") -> list[dict]:
    """One tool step: a call and its result of 20 numbered lines (358 tokens with the call, o200k_base)."""
    call = {"id": f"{tag}{k}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"cmd": f"cat f{k}.py"})}}
    out = "\n".join(f"line {i} of f{k}.py: value_{k}_{i} = {i * k}" for i in range(20))
    return [{"role": "assistant", "content": f"step {k}", "tool_calls": [call]}, {"role": "tool", "tool_call_id": f"{tag}{k}", "content": out}]


def opening(task: str = "Fix the parser.") -> list[dict]:
    return [{"role": "system", "content": "You are a shell agent."}, {"role": "user", "content": task}]


def drive(conversations: dict[str, list[dict]], steps: int, policy=None) -> dict[str, list]:
    """Grow each conversation by one step per round, rendering each after its step, the
    conversations interleaved; per conversation, each call's (messages as JSON, cache-stable kind,
    policy, the end of the old generation the call kept)."""
    out: dict[str, list] = {name: [] for name in conversations}
    for k in range(steps):
        for name, msgs in conversations.items():
            msgs += step(k, name)
            r = render_messages(msgs, budget=B, explain=True, **({} if policy is None else {"policy": policy}))
            out[name].append(([json.dumps(m, sort_keys=True) for m in r.messages], r.rendering.stats.get("cache_stable"),
                              r.rendering.policy, (r.rendering.stats.get("cache_boundaries") or [0])[0]))
    return out


def reselections(calls: list) -> list[int]:
    """Calls whose messages do not start with the previous call's."""
    return [i for i in range(1, len(calls)) if calls[i][0][:len(calls[i - 1][0])] != calls[i - 1][0]]


def test_without_a_store_a_growing_conversation_only_appends_between_reselections():
    calls = drive({"a": opening()}, 30)["a"]
    assert {c[2] for c in calls} == {"learned-stable"}  # the default policy, wrapped
    broken = reselections(calls)
    # the history changes only at re-selections and minor collections, which keep the old generation
    assert all(calls[i][1] in ("reselected", "collected") for i in broken)
    assert all(calls[i][0][:calls[i][3]] == calls[i - 1][0][:calls[i][3]] and calls[i][3] >= 2 for i in broken
               if calls[i][1] == "collected")
    # the history (358 tokens a step; the system and current user messages are outside B) passes
    # B = 4000 at the 12th step (358·11 = 3938, 358·12 = 4296): the first change is there
    assert broken and broken[0] == 11, broken
    # a re-selection renders to 0.75·B = 3000, which takes ⌈1000 / 358⌉ = 3 more steps to pass B:
    # at most one re-selection per 3 calls
    majors = [i for i in broken if calls[i][1] == "reselected"]
    assert all(b - a >= 3 for a, b in zip(majors, majors[1:])), majors
    # a policy instance is not wrapped: it re-selects at every call over B (its history is never a prefix)
    plain = drive({"a": opening()}, 30, policy=create("learned"))["a"]
    assert {c[2] for c in plain} == {"learned"} and len(reselections(plain)) > 2 * len(majors)


def test_interleaved_conversations_each_go_on_as_if_rendered_alone():
    """Two conversations with the same opening (runs of one task) and one with another, rendered
    in turn, get the renderings each gets alone."""
    together = drive({"a": opening(), "b": opening(), "c": opening("Add a test.")}, 20)
    for name, task in (("a", "Fix the parser."), ("b", "Fix the parser."), ("c", "Add a test.")):
        assert together[name] == drive({name: opening(task)}, 20)[name], name


def test_a_conversation_whose_earlier_message_changed_is_rendered_anew():
    msgs = opening()
    for k in range(12):
        msgs += step(k)
        render_messages(msgs, budget=B)
    edited = [dict(m) for m in msgs]
    edited[3] = {**edited[3], "content": "EDITED " + edited[3]["content"]}
    r = render_messages(edited + step(12), budget=B, explain=True)
    assert r.rendering.stats["cache_stable"] == "reselected"
    assert all("EDITED" not in m.get("content", "") or m is edited[3] for m in r.messages)


def test_a_session_without_a_store_is_cache_stable():
    s = Session(budget=B)
    previous: list[str] = []
    kinds = []
    for m in opening():
        s.add(m)
    for k in range(20):
        for m in step(k):
            s.add(m)
        out = [json.dumps(m, sort_keys=True) for m in s.render()]
        kinds.append(s.rendering.stats["cache_stable"])
        if kinds[-1] == "appended":
            assert out[:len(previous)] == previous
        previous = out
    assert s.rendering.policy == "learned-stable" and kinds.count("appended") > kinds.count("reselected")


def test_after_a_pause_longer_than_the_cache_ttl_the_library_reselects(monkeypatch):
    """Messages are kept with the time they arrived: with a clock moving 10 s a call, a pause of
    400 s before a conversation's 15th step makes that call re-select (``expired``) where it
    would otherwise have appended, with or without a store, and no other call."""
    import historygraph.api as api

    def kinds(pause: float, **kw) -> list:
        now = [1.8e9]
        monkeypatch.setattr(api.time, "time", lambda: now[0])
        msgs = opening(f"Fix the parser ({pause}, {len(kw)}).")
        out = []
        for k in range(20):
            now[0] += 10.0 + (pause if k == 14 else 0.0)
            msgs += step(k, "p")
            out.append(render_messages(msgs, budget=B, explain=True, **kw).rendering.stats.get("cache_stable"))
        return out

    for kw in ({}, {"session": "paused"}):
        steady, paused = kinds(0.0, **kw), kinds(400.0, **{k: v + "-2" for k, v in kw.items()})
        assert steady[14] == "appended" and "expired" not in steady, steady
        assert [k for k, x in enumerate(paused) if x == "expired"] == [14], paused
