"""Pins (issue 40): a pinned message or tool result is shown whole by every policy, kept in the
store across reopening, and a budget that cannot hold the pins is refused naming them."""

from __future__ import annotations

import pytest

from historygraph import Session
from historygraph.history.events import Message, ToolCall
from historygraph.history.graph import ContextGraph
from historygraph.policies import Signals, create
from historygraph.render import BudgetTooSmallError, InvariantError, check_invariants
from historygraph.store import MemoryStore, SQLiteStore

from doubles import MODEL_FREE, ScriptedModel, TableScorer
from test_store import pg_dsn  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def signals():
    # summarising policies get a deterministic test-double model: pins concern what is shown whole,
    # not the summary text
    return Signals(model_factory=ScriptedModel, scorer_factory=TableScorer)


def result_text(i: int, words: int = 300) -> str:
    return f"listing {i}: " + " ".join(f"file{i}_{k}.py" for k in range(words))


def history() -> list[Message]:
    """A task, a user note at position 2, then nine steps of one call and a result of ~1,500
    tokens each (c0 … c8), the last one the newest."""
    msgs = [Message("system", "You are a coding agent."), Message("user", "Fix the failing test in the repo."),
            Message("user", "note: the database port is 8081, not 5432")]
    for i in range(9):
        msgs.append(Message("assistant", f"step {i}: list the files", (ToolCall(f"c{i}", "bash", f'{{"cmd": "ls d{i}"}}'),)))
        msgs.append(Message("tool", result_text(i), tool_call_id=f"c{i}"))
    return msgs


def graph_with_pins(*refs: str) -> ContextGraph:
    g = ContextGraph("pins", history())
    g.pins = frozenset(g.position_of(r) for r in refs)
    return g


@pytest.mark.parametrize("name", MODEL_FREE)
def test_every_model_free_policy_shows_an_old_pinned_result_whole(name, signals):
    g = graph_with_pins("c1", "#2")
    c1 = g.result_of["c1"]
    assert (c1, g.messages[c1].content) == (6, result_text(1))  # position by construction of history()
    budget = 4000  # about two of the nine results: without the pin, c1 (the second oldest) is not shown whole
    unpinned = create(name).render(ContextGraph("plain", history()), budget, signals)
    r = create(name).render(g, budget, signals)
    check_invariants(r, g, signals.counter)
    shown = dict(zip(r.positions, r.messages))
    assert shown[c1].content == result_text(1) and c1 in r.full
    assert shown[c1 - 1] == g.messages[c1 - 1]  # its call, verbatim
    assert shown[2] == g.messages[2]  # the pinned user note
    assert r.history_tokens <= budget or name == "full"
    if name != "full":
        plain = dict(zip(unpinned.positions, unpinned.messages))
        assert c1 not in plain or plain[c1].content != result_text(1)  # the pin made the difference


@pytest.mark.parametrize("name", MODEL_FREE)
def test_pins_alone_over_the_budget_raise_the_budget_error_naming_them(name, signals):
    if name == "full":
        pytest.skip("full shows the whole history and never raises")
    g = graph_with_pins("c1", "c2")
    two = sum(signals.counter.count(g.messages[g.result_of[c]].content) for c in ("c1", "c2"))
    assert two > 3000  # two results of 301 words of ~5 tokens each
    with pytest.raises(BudgetTooSmallError) as info:
        create(name).render(g, 3000, signals)
    assert info.value.required > two and set(info.value.pins) == {"c1", "c2"}
    assert "pinned items c1, c2" in str(info.value)


def test_the_check_refuses_a_rendering_that_hides_a_pinned_result(signals):
    g = ContextGraph("pins", history())
    r = create("prune").render(g, 4000, signals)  # rendered before the pin: c1 as a placeholder
    check_invariants(r, g, signals.counter)
    g.pins = frozenset({g.result_of["c1"]})
    with pytest.raises(InvariantError, match=r"pins: pinned item c1 \(position 6\) was shown as placeholder"):
        check_invariants(r, g, signals.counter)


def test_a_pinned_result_replaced_by_a_later_result_pins_the_later_one(signals):
    msgs = history()
    late = Message("tool", "the real output of c1", tool_call_id="c1")
    g = ContextGraph("pins", msgs + [late])
    g.pins = frozenset({6})  # the first result of c1, superseded by the one at the end
    assert g.pinned() == [len(msgs)]
    r = create("prune").render(g, 4000, signals)
    check_invariants(r, g, signals.counter)
    assert dict(zip(r.positions, r.messages))[len(msgs)] is late


def test_session_pins_persist_across_reopening_a_sqlite_store(tmp_path, signals):
    path = tmp_path / "pins.sqlite"
    s = Session("run", store=SQLiteStore(path), policy="prune", budget=4000, signals=signals)
    msgs = history()
    for m in msgs:
        s.add(m, pin=m.content.startswith("note:"))
    assert s.pin("c1") == 6 and s.pin("c3") == 10 and s.unpin("c3") == 10
    assert s.pins == ["#2", "c1"]
    with pytest.raises(KeyError, match="no item 'c99'"):
        s.pin("c99")
    s.store.close()
    s = Session("run", store=SQLiteStore(path), policy="prune", budget=4000, signals=signals)
    assert s.pins == ["#2", "c1"]
    out = s.render()
    assert {"role": "tool", "content": result_text(1), "tool_call_id": "c1"} in out
    assert {"role": "user", "content": "note: the database port is 8081, not 5432"} in out
    s.unpin("c1")
    assert {"role": "tool", "content": result_text(1), "tool_call_id": "c1"} not in s.render()
    with pytest.raises(BudgetTooSmallError, match="pinned items #2, c1"):
        s.pin("c1")
        s.render(budget=1000)
    s.store.close()


def test_a_pin_made_by_another_store_instance_is_seen_at_the_next_render(tmp_path, signals):
    path = tmp_path / "shared.sqlite"
    a, b = SQLiteStore(path), SQLiteStore(path)
    a.create_session("run")
    a.append("run", history())
    assert b.graph("run").pins == frozenset()
    a.pin("run", "c1")
    assert b.graph("run").pins == {6} and b.pins("run") == [6]
    a.close()
    b.close()


def test_pin_references_and_their_errors():
    store = MemoryStore()
    store.create_session("s")
    store.append("s", history())
    assert [store.pin("s", r) for r in (3, "#4", "c0")] == [3, 4, 4]
    assert store.pins("s") == [3, 4]
    for bad, why in ((99, "holds messages #0–#20"), ("#21", "holds messages #0–#20"), ("nope", "name a tool call id")):
        with pytest.raises(KeyError, match=why):
            store.pin("s", bad)
    assert store.pins("s") == [3, 4]


@pytest.mark.parametrize("name", MODEL_FREE)
def test_a_pin_made_between_two_renders_is_shown_at_the_second(name, signals):
    """Policies that keep state between calls (the cache-stable variants append to their previous
    rendering, ReCAP keeps its selection within a user turn) re-select when a pin is new."""
    msgs = history()
    g = ContextGraph("pins", msgs[:-2])
    policy = create(name)
    first = policy.render(g, 4000, signals)
    c1 = g.result_of["c1"]
    before = dict(zip(first.positions, first.messages))
    assert name == "full" or c1 not in before or before[c1].content != result_text(1)  # not whole before the pin
    g.extend(msgs[-2:])
    g.pins = frozenset({c1})
    r = policy.render(g, 4000, signals)
    check_invariants(r, g, signals.counter)
    assert dict(zip(r.positions, r.messages))[c1].content == result_text(1)


def test_pins_persist_in_postgres_and_another_instance_sees_them(pg_dsn, signals):  # noqa: F811
    from historygraph.store.postgres import PostgresStore

    a = PostgresStore(pg_dsn)
    a.create_session("run")
    a.append("run", history())
    b = PostgresStore(pg_dsn)
    assert a.pin("run", "c1") == 6 and a.pin("run", "#2") == 2 and a.pin("run", "c1") == 6
    assert b.pins("run") == [2, 6] and b.graph("run").pins == {2, 6}
    b.pin("run", "#2", pinned=False)
    assert a.graph("run").pins == {6}
    a.close()
    b.close()
    s = Session("run", store=PostgresStore(pg_dsn), policy="prune", budget=4000, signals=signals)
    assert s.pins == ["c1"] and {"role": "tool", "content": result_text(1), "tool_call_id": "c1"} in s.render()
    s.store.close()
