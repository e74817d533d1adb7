"""Derived rows kept with a stored session (historygraph.history.derived): what a reopened session reads
instead of recomputing, when it is written, and that a row is never used for anything it was not
computed from (another code version, other result positions, other earlier steps)."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest

from historygraph.history import derived as derived_mod
from historygraph.history.derived import Derived, DerivedKind, pack_array, source_version, unpack_array
from historygraph.history.events import Message, ToolCall
from historygraph.policies.learned import facts_cache as facts_cache_mod, features as features_mod, result_facts as result_facts_mod
from historygraph.policies.learned.stored_kinds import FACTS_SNAPSHOT
from historygraph.history.graph import TFA_VALUES, ContextGraph
from historygraph.signals.steps import features as steps_mod, parents as steps_parents, view as steps_view
from historygraph.signals.steps.features import STEP_FEATURES
from historygraph.signals.steps.view import lowcost_steps
from historygraph.signals.tokens import TokenCounter
from historygraph.store import MemoryStore, SQLiteStore
from test_store import make_store, pg_dsn  # noqa: F401 (fixtures)


def call(cid: str, command: str) -> ToolCall:
    return ToolCall(cid, "bash", '{"command": "%s"}' % command)


EVENTS = [
    Message("user", "fix parse_date in utils/dates.py"),
    Message("assistant", "look", (call("c1", "cat utils/dates.py"),)),
    Message("tool", "def parse_date(s):\n    return DATE_RE.match(s)  # utils/dates.py v2_0_1", tool_call_id="c1"),
    Message("assistant", "run the tests", (call("c2", "pytest tests/test_dates.py"),)),
    Message("tool", "FAILED tests/test_dates.py::test_parse_date - AssertionError\n1 failed in 0.1s", tool_call_id="c2"),
    Message("assistant", "edit parse_date with DATE_RE v2_0_1", (call("c3", "sed -i s/x/y/ utils/dates.py"),)),
    Message("tool", "", tool_call_id="c3"),
    Message("assistant", "rerun", (call("c4", "pytest tests/test_dates.py"),)),
    Message("tool", "tests/test_dates.py::test_parse_date PASSED\n1 passed in 0.1s", tool_call_id="c4"),
]
ROWS = 8 + 4 + 4  # TFA values of 4 assistant messages and 4 results; features and parents of 4 steps


def reopen(store, make):
    """The store as a new process would see it: a new instance (memory: the same one with its
    graph cache dropped, as a bounded cache drops it)."""
    if isinstance(store, MemoryStore):
        store.flush()
        store.graph_cache = 1
        if not store.has_session("other"):
            store.create_session("other")
        store.graph("other")  # evicts the session's graph
        store.graph_cache = None
        return store
    store.close()
    return make()


def spy_extractors(monkeypatch) -> list[str]:
    """Record every text the extractors whose results are stored are run on (the TFA values of a
    message must not be extracted at all)."""
    texts: list[str] = []

    def spy(fn):
        def run(text, *a):
            texts.append(text)
            return fn(text, *a)
        return run
    for mod in (features_mod, facts_cache_mod, result_facts_mod, steps_mod):
        for name in ("identifiers_in", "files_in", "extract_values", "parse_test_output", "call_kind", "words"):
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, spy(getattr(mod, name)))

    def boom(text):
        raise AssertionError(f"TFA values extracted again: {text!r:.60}")
    monkeypatch.setattr("historygraph.history.graph.extract_values", boom)
    return texts


def test_a_reopened_session_reads_what_it_derived_instead_of_recomputing_it(make_store, monkeypatch):  # noqa: F811
    store = make_store()
    store.create_session("s")
    store.append("s", EVENTS)
    g = store.graph("s")
    fresh = ContextGraph("s", EVENTS)
    want_steps = lowcost_steps(fresh)
    want_facts = features_mod.feature_matrix(fresh, fresh.results(), TokenCounter())
    lowcost_steps(g)
    features_mod.feature_matrix(g, g.results(), TokenCounter())
    store = reopen(store, make_store)
    texts = spy_extractors(monkeypatch)
    g2 = store.graph("s")
    assert g2.messages == EVENTS  # the events are untouched
    assert g2.edges() == fresh.edges() and [g2.reuse_score(p) for p in g2.results()] == [fresh.reuse_score(p) for p in fresh.results()]
    assert lowcost_steps(g2) == want_steps
    assert want_steps[1].test_results.failed == 1 and (want_steps[1].validation_status, want_steps[1].superseded_by) == ("superseded", 3)
    assert want_steps[2].parents == (0,)  # shares dates.py with step 0
    assert (features_mod.feature_matrix(g2, g2.results(), TokenCounter()) == want_facts).all()
    # what was extracted is the query of this render (the task, the latest message), no stored message
    assert texts and not [t for t in texts for m in EVENTS if m.role == "tool" and m.content and m.content in t]
    store.close()


def test_rows_are_written_with_the_next_append(tmp_path, monkeypatch):
    path = tmp_path / "s.sqlite"
    a = SQLiteStore(path)
    a.create_session("s")
    a.append("s", EVENTS[:5])
    lowcost_steps(a.graph("s"))
    a.append("s", EVENTS[5:])  # carries the rows derived so far, in its transaction; `a` is never closed
    b = SQLiteStore(path)
    with sqlite3.connect(path) as db:
        kinds = dict(db.execute("SELECT kind, count(*) FROM derived GROUP BY kind").fetchall())
    assert kinds[TFA_VALUES.name] == 4 and kinds[STEP_FEATURES.name] == 2  # the messages of the first append, its two steps
    steps = lowcost_steps(b.graph("s"))
    assert steps == lowcost_steps(ContextGraph("s", EVENTS))
    b.close()
    a.close()


def test_rows_of_another_code_version_are_recomputed_and_replaced(tmp_path, monkeypatch):
    path = tmp_path / "s.sqlite"
    s = SQLiteStore(path)
    s.create_session("s")
    s.append("s", EVENTS)
    lowcost_steps(s.graph("s"))
    s.close()
    with sqlite3.connect(path) as db:
        before = db.execute("SELECT count(*), count(DISTINCT version) FROM derived").fetchone()
    monkeypatch.setattr(derived_mod, "source_version", lambda modules: "changed")  # as an edit to the extractor would
    calls = []
    real = steps_mod.extract  # a step's features, from its messages
    monkeypatch.setattr(steps_mod, "extract", lambda *args, **kw: calls.append(args[1]) or real(*args, **kw))
    s = SQLiteStore(path)
    assert lowcost_steps(s.graph("s")) == lowcost_steps(ContextGraph("s", EVENTS))
    assert len(calls) == 4 * 2  # each step's features recomputed (the fresh graph computes them again too)
    s.close()
    with sqlite3.connect(path) as db:
        after = db.execute("SELECT count(*), count(DISTINCT version), min(version) FROM derived").fetchone()
    assert before[0] == after[0] == ROWS and before[1] == 2 and after[1:] == (1, "changed")


def test_a_stored_step_row_is_not_used_for_other_result_positions():
    """A step whose result arrived later (and the steps after it) get features and parents
    computed from what is stored now, not the rows written before."""
    early = EVENTS[:4] + [Message("assistant", "meanwhile", (call("c9", "ls utils"),)),
                          Message("tool", "dates.py", tool_call_id="c9")]
    late = early + [EVENTS[4]]  # the pytest result arrives after the next step
    g = ContextGraph("s", early, derived=Derived(persist=True))
    lowcost_steps(g)
    rows, _ = g.derived.take()
    g2 = ContextGraph("s", late, derived=Derived(rows))
    assert lowcost_steps(g2) == lowcost_steps(ContextGraph("s", late))
    assert lowcost_steps(g2)[1].test_results is not None  # recomputed with the result that arrived


def test_stored_parents_are_used_only_for_the_same_earlier_steps():
    g = ContextGraph("s", EVENTS, derived=Derived(persist=True))
    lowcost_steps(g)
    rows, _ = g.derived.take()
    step2 = EVENTS.index(EVENTS[5])
    assert [json.loads(d)[0] for k, _v, p, d in rows if k.startswith("steps.parents")] == [9, 9, 9, 9]  # messages then

    def with_parents(messages):
        return [(k, v, p, json.dumps([messages, [1]])) if k.startswith("steps.parents") and p == step2
                else (k, v, p, d) for k, v, p, d in rows]
    # picked when the graph held 9 or 7 messages: every result of steps 0-2 (positions 2, 4, 6) was
    # there, so the row is used as it stands (here: forged parents)
    for messages in (9, 7):
        assert lowcost_steps(ContextGraph("s", EVENTS, derived=Derived(with_parents(messages))))[2].parents == (1,)
    # picked before step 2's own result (position 6) was stored, or a count that cannot hold the
    # step, or another row format: the parents are chosen again
    for messages in (6, 5, 10, "0" * 24, None):
        assert lowcost_steps(ContextGraph("s", EVENTS, derived=Derived(with_parents(messages))))[2].parents == (0,)


def test_a_graph_not_from_a_store_keeps_nothing():
    g = ContextGraph("s", EVENTS)
    lowcost_steps(g)
    assert g.derived.take() == ([], [])


def test_source_version_follows_the_source_and_python():
    steps = ("historygraph.signals.steps.features", "historygraph.signals.steps.parents",  # (the step view's modules)
             "historygraph.signals.steps.stored", "historygraph.signals.steps.view")
    v = source_version((*steps, "historygraph.signals.test_output"))
    assert len(v) == 16 and v == STEP_FEATURES.version != TFA_VALUES.version
    assert source_version((*steps,)) != v != source_version(("historygraph.signals.test_output", *steps))
    assert source_version(("json.decoder",)) != source_version(("json.encoder",))
    assert DerivedKind("x", (*steps, "historygraph.signals.test_output")).version == v


def test_a_version_2_sqlite_store_gains_the_derived_table_and_keeps_everything(tmp_path):

    from test_migrations import sqlite_at_version

    path = tmp_path / "v2.sqlite"
    with sqlite_at_version(path, 2) as db:
        db.execute("INSERT INTO sessions VALUES ('s', 0, '{\"k\": 1}')")
        for i, m in enumerate(EVENTS):
            db.execute("INSERT INTO events VALUES ('s', ?, ?)", (i, json.dumps(m.to_dict())))
    s = SQLiteStore(path)
    assert s.schema_version == 7 and s.messages("s") == EVENTS and s.session_meta("s") == {"k": 1}
    lowcost_steps(s.graph("s"))
    s.append("s", Message("user", "thanks"))
    s.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT version FROM schema_version").fetchall() == [(7,)]
        assert db.execute("SELECT count(*) FROM derived WHERE session_id = 's'").fetchone()[0] == ROWS
    s = SQLiteStore(path)
    assert s.messages("s") == EVENTS + [Message("user", "thanks")]
    s.close()


def test_a_version_2_postgres_store_gains_the_derived_table(pg_dsn):  # noqa: F811
    import psycopg

    from historygraph.store.postgres import MIGRATIONS, PostgresStore

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for step in MIGRATIONS[:2]:
            c.execute(step.sql)
        c.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        c.execute("INSERT INTO schema_version VALUES (2)")
        c.execute("INSERT INTO sessions (id, created, meta) VALUES ('s', 0, '{}')")
        for i, m in enumerate(EVENTS):
            c.execute("INSERT INTO events VALUES ('s', %s, %s)", (i, json.dumps(m.to_dict())))
    s = PostgresStore(pg_dsn)
    assert s.schema_version == 7 and s.messages("s") == EVENTS
    want = lowcost_steps(s.graph("s"))
    s.close()
    s = PostgresStore(pg_dsn)
    assert lowcost_steps(s.graph("s")) == want
    s.close()
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM derived").fetchone()[0] == ROWS


@pytest.mark.parametrize("persist", [True, False])
def test_put_and_take(persist):
    kind = DerivedKind("k", ("historygraph.history.derived",))
    d = Derived([("k", kind.version, 3, "[1, 2]"), ("k", "old", 4, "{}"), ("j", "v", 0, "7")], persist=persist)
    assert d.table(kind) == {3: [1, 2]} and d.table(kind) is d.table(kind)
    d.put(kind, 5, ("a", None))
    d.put(kind, 5, ["b"])  # the later value replaces the earlier
    assert d.take() == (([("k", kind.version, 5, '["b"]')], [("k", kind.version)]) if persist else ([], []))
    assert d.take() == ([], [])


def _stored_tokens(path) -> dict[str, dict[int, object]]:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT kind, position, data FROM derived WHERE kind LIKE 'render.tokens:%'").fetchall()
    out: dict[str, dict[int, object]] = {}
    for kind, pos, data in rows:
        out.setdefault(kind, {})[pos] = json.loads(data)
    return out


def test_token_counts_are_kept_per_encoding_and_read_at_their_position(tmp_path):
    """A render keeps each message's count (and a result's placeholder's count) as rows named for
    the encoding and placeholder builder; a reopened session uses them at their own position, and
    a counter of another encoding neither reads them nor is changed by them."""
    from historygraph.render import Layout, placeholder_for
    from historygraph.render._memo import token_rows
    from historygraph.policies.baselines.windows import mask_placeholder

    path = tmp_path / "s.sqlite"
    s = SQLiteStore(path)
    s.create_session("s")
    s.append("s", EVENTS)
    o200k, cl100k = TokenCounter("o200k_base"), TokenCounter("cl100k_base")
    Layout(s.graph("s"), o200k, None)
    Layout(s.graph("s"), o200k, None, placeholder=mask_placeholder)
    s.close()
    rows = _stored_tokens(path)
    kind = "render.tokens:o200k_base:historygraph.render.markers.placeholder_for"
    assert set(rows) == {kind, "render.tokens:o200k_base:historygraph.policies.baselines.windows.mask_placeholder"}
    want = {p: [o200k.count_message(m), o200k.count_message(placeholder_for(m, o200k))] if m.role == "tool"
            else o200k.count_message(m) for p, m in enumerate(EVENTS)}
    assert rows[kind] == want and want[0] == 3 + 8  # MESSAGE_OVERHEAD = 3, and 8 tokens of text (tiktoken o200k_base)
    with sqlite3.connect(path) as db:  # mark two rows, so that what is read shows where it came from
        db.execute("UPDATE derived SET data = '777' WHERE kind = ? AND position = 1", (kind,))
        db.execute("UPDATE derived SET data = '[888, 9]' WHERE kind = ? AND position = 2", (kind,))
    s = SQLiteStore(path)
    g = s.graph("s")
    lay = Layout(g, o200k, None)
    assert lay._tokens[1] == 777 and lay.full_cost[2] == 888 and lay.placeholder_tokens[2] == 9
    assert lay._tokens[3] == o200k.count_message(EVENTS[3]) and lay.full_cost[4] == want[4][0]  # type: ignore[index]
    assert lay.placeholder[2] == placeholder_for(EVENTS[2], o200k)  # built when asked for
    other = Layout(g, cl100k, None)  # another encoding: its own counts, its own rows
    assert other._tokens == [cl100k.count_message(m) for m in EVENTS]
    assert other.placeholder_tokens[2] == cl100k.count_message(placeholder_for(EVENTS[2], cl100k))
    s.close()
    assert _stored_tokens(path)["render.tokens:cl100k_base:historygraph.render.markers.placeholder_for"][1] == cl100k.count_message(EVENTS[1])
    # a counter that may count differently, or a builder that is not a plain function, keeps nothing
    assert token_rows(False, "o200k_base", placeholder_for) is None
    assert token_rows(True, "o200k_base", lambda m, c: m) is None


def test_rows_are_decoded_as_json_reads_them():
    """The fast decoder's values are json.loads's, including what it refuses (NaN) or reads as
    another type elsewhere (big integers, escapes)."""
    kind = DerivedKind("test.kind", ("historygraph.history.derived",))
    data = {0: "[1, 2.5, null]", 1: '"\\u00e9\\ud83d\\ude00"', 2: "123456789012345678901234567890", 3: "NaN", 4: "{\"a\": [true]}"}
    t = Derived([(kind.name, kind.version, p, d) for p, d in data.items()]).table(kind)
    want = {p: json.loads(d) for p, d in data.items()}
    assert t.keys() == want.keys() and t[3] != t[3]
    assert {p: v for p, v in t.items() if p != 3} == {p: v for p, v in want.items() if p != 3}
    assert type(t[2]) is int


def test_brief_savings_are_kept_per_encoding_and_read_at_their_position(tmp_path):
    """What the brief view of each assistant message with calls saves (brief revivals) is kept as
    rows named for the encoding; a reopened session uses them at their own position only, and a
    counter of another encoding computes its own."""
    from historygraph.render import BRIEF
    from historygraph.render._memo import brief_savings

    long_text = "I will now look at the date parser and its regular expression in detail " * 3
    events = [EVENTS[0], Message("assistant", long_text, (call("c1", "cat utils/dates.py"),)), EVENTS[2],
              Message("assistant", long_text + "again", (call("c2", "pytest tests/test_dates.py"),)), EVENTS[4]]
    o200k, cl100k = TokenCounter("o200k_base"), TokenCounter("cl100k_base")

    def saving(c, p):
        m = events[p]
        return c.count_message(m) - c.count_message(m.with_content(BRIEF.format(tokens=c.count(m.content), position=p), "brief"))
    path = tmp_path / "s.sqlite"
    s = SQLiteStore(path)
    s.create_session("s")
    s.append("s", events)
    assert brief_savings(s.graph("s"), o200k).tolist() == [0, saving(o200k, 1), 0, saving(o200k, 3), 0]
    assert saving(o200k, 1) > 20
    s.close()
    with sqlite3.connect(path) as db:
        assert dict(db.execute("SELECT position, data FROM derived WHERE kind = 'render.brief:o200k_base'").fetchall()) == \
            {1: str(saving(o200k, 1)), 3: str(saving(o200k, 3))}
        db.execute("UPDATE derived SET data = '777' WHERE kind = 'render.brief:o200k_base' AND position = 1")
    s = SQLiteStore(path)
    g = s.graph("s")
    assert brief_savings(g, o200k).tolist() == [0, 777, 0, saving(o200k, 3), 0]
    assert brief_savings(g, cl100k).tolist() == [0, saving(cl100k, 1), 0, saving(cl100k, 3), 0]
    s.close()


def test_a_reopened_view_starts_from_its_snapshot(tmp_path, monkeypatch):
    """A view kept as a snapshot (steps.view) is read whole on reopen: the steps it holds extract
    nothing and read no feature row until a caller looks at their files (then the step's row is
    read); the view is extended with the messages appended since and equals a fresh graph's."""
    monkeypatch.setattr(derived_mod, "SNAPSHOT_MIN", 4)
    path = tmp_path / "s.sqlite"
    s = SQLiteStore(path)
    s.create_session("s")
    s.append("s", EVENTS[:7])
    lowcost_steps(s.graph("s"))
    s.close()
    with sqlite3.connect(path) as db:
        (data,) = db.execute("SELECT data FROM derived WHERE kind LIKE 'steps.view:%'").fetchone()
    snap = json.loads(data)  # the steps of the assistant messages 1, 3, 5, as columns
    assert snap["upto"] == 7 and snap["steps"] == 3 and snap["status"] == "ufu"  # cat: no test run; pytest: 1 failed; sed: none
    assert unpack_array(snap["result_counts"]).tolist() == [1, 1, 1] and unpack_array(snap["results"]).tolist() == [2, 4, 6]
    want7, want = lowcost_steps(ContextGraph("s", EVENTS[:7])), lowcost_steps(ContextGraph("s", EVENTS))
    s = SQLiteStore(path)
    texts = spy_extractors(monkeypatch)
    g = s.graph("s")
    key = f"lowcost:{steps_parents.ParentScoring()}"
    view = steps_view._view(g, steps_parents.lowcost_selector(steps_parents.ParentScoring()), key)
    assert type(view).__name__ == "_LazySteps" and view.raw == 3 and not view.built  # no step built before it is read
    assert type(steps_mod.graph_cache(g)["index"].get("files")).__name__ == "Raw"  # the inverted index not decoded
    assert view[-1].position == 5 and view.raw == 2
    assert [type(x).__name__ for x in view] == ["_StoredStep"] * 3
    assert all("_load" in x.__dict__ for x in view)  # nothing read yet
    assert STEP_FEATURES.name in g.derived._raw  # the feature rows not decoded
    assert view == want7  # read from the rows now
    assert texts == []  # nothing extracted
    monkeypatch.undo()
    s.append("s", EVENTS[7:])
    assert lowcost_steps(g) == want
    assert lowcost_steps(g)[1].validation_status == "superseded" and lowcost_steps(g)[2].parents == (0,)
    s.close()


def test_a_view_snapshot_is_used_only_for_the_same_steps():
    """A snapshot whose steps do not have the results the graph gives them among its first
    ``upto`` messages is not used (here: forged); one taken while a result was missing is used and
    the step rebuilt when the result arrives."""
    early = EVENTS[:4] + [Message("assistant", "meanwhile", (call("c9", "ls utils"),)),
                          Message("tool", "dates.py", tool_call_id="c9")]
    late = early + [EVENTS[4]]  # the pytest result arrives after the next step
    old = derived_mod.SNAPSHOT_MIN
    derived_mod.SNAPSHOT_MIN = 4
    try:
        g = ContextGraph("s", early, derived=Derived(persist=True))
        lowcost_steps(g)
    finally:
        derived_mod.SNAPSHOT_MIN = old
    rows, _ = g.derived.take()
    (snap,) = [r for r in rows if r[0].startswith("steps.view:")]
    data = json.loads(snap[3])
    assert data["open"] == [1] and unpack_array(data["result_counts"]).tolist() == [1, 0, 1]
    assert unpack_array(data["results"]).tolist() == [2, 5]
    key = f"lowcost:{steps_parents.ParentScoring()}"

    def view_of(g):  # noqa: ANN001, ANN202
        return steps_view._view(g, steps_parents.lowcost_selector(steps_parents.ParentScoring()), key)
    g2 = ContextGraph("s", late, derived=Derived(rows, persist=True))
    assert lowcost_steps(g2) == lowcost_steps(ContextGraph("s", late))
    assert lowcost_steps(g2)[1].test_results is not None
    assert type(view_of(g2)).__name__ == "_LazySteps" and type(view_of(g2)[0]).__name__ == "_StoredStep"  # used
    assert type(view_of(g2)[1]).__name__ == "Step"  # built again: its result arrived
    forgeries = [{"results": pack_array(np.array([2, 3]))},  # step 2's result is at position 5
                 {"result_counts": pack_array(np.array([1, 1, 1]))},  # three results listed, two stored
                 {"status": "fxu"}, {"steps": 4}, {"parents": pack_array(np.array([0.5]))}, {"runs": [[7, None]]}]
    for forged_part in forgeries:
        forged = [r if r is not snap else (*r[:3], json.dumps({**data, **forged_part})) for r in rows]
        g3 = ContextGraph("s", late, derived=Derived(forged, persist=True))
        got = lowcost_steps(g3)
        assert got == lowcost_steps(ContextGraph("s", late)) and got[2].results == (5,), forged_part
        assert all(type(x).__name__ == "Step" for x in view_of(g3)), forged_part


def test_learned_state_starts_from_its_snapshot(tmp_path, monkeypatch):
    """learned's per-graph state kept as a snapshot (learned.graph) is read on reopen and extended
    with the messages appended since: the feature matrix is bit for bit a fresh graph's, and so
    is every result's facts (built when asked for); no stored result is extracted again except
    the ones a render asks the facts of (the newest)."""
    monkeypatch.setattr(derived_mod, "SNAPSHOT_MIN", 4)
    counter = TokenCounter()
    path = tmp_path / "s.sqlite"
    s = SQLiteStore(path)
    s.create_session("s")
    s.append("s", EVENTS[:7])
    features_mod.feature_matrix(s.graph("s"), s.graph("s").results(), counter)
    s.close()
    with sqlite3.connect(path) as db:
        (data,) = db.execute("SELECT data FROM derived WHERE kind = ?", (FACTS_SNAPSHOT.name,)).fetchone()
    assert json.loads(data)["upto"] == 7 and json.loads(data)["rows"] == [2, 4, 6]
    # the observed reuse read and the postings complete as of those 7 messages: nothing read or sorted again
    snap, seven = json.loads(data), ContextGraph("s", EVENTS[:7])
    assert snap["reuse_read"] == len(seven.reuse.touched) > 0
    assert sorted(p for p, _, _ in snap["reuse_seen"]) == sorted(seven.reuse.matches)
    assert all(snap[name][5] == snap[name][2][1][0] for name in ("values_t", "idents_t", "words_t", "files_t"))
    fresh = ContextGraph("s", EVENTS)
    want = features_mod.feature_matrix(fresh, fresh.results(), counter)
    want_gf = features_mod.graph_facts(fresh, counter)
    s = SQLiteStore(path)
    s.append("s", EVENTS[7:])
    g = s.graph("s")
    texts = spy_extractors(monkeypatch)
    got = features_mod.feature_matrix(g, g.results(), counter)
    assert got.tobytes() == want.tobytes()
    gf = features_mod.graph_facts(g, counter)
    assert sorted(gf.facts.cache) == []  # the newest result (8) is not from the snapshot: no old one was built
    assert [t for t in texts for m in EVENTS[:7] if m.role == "tool" and m.content and m.content in t] == []
    monkeypatch.undo()
    assert list(gf.facts) == list(want_gf.facts) == [2, 4, 6, 8] and len(gf.facts) == 4 and 6 in gf.facts
    assert [gf.facts[p] for p in gf.facts] == [want_gf.facts[p] for p in want_gf.facts]
    assert gf.ident_turns == want_gf.ident_turns and gf.value_first == want_gf.value_first
    for name in ("reuse_score", "reuse_turns", "reuse_last", "reuse_recent"):
        assert getattr(gf, name).view().tobytes() == getattr(want_gf, name).view().tobytes(), name
    assert gf.reuse_seen == want_gf.reuse_seen and gf.reuse_read == want_gf.reuse_read
    s.close()


def test_bm25_index_starts_from_its_snapshot(tmp_path, monkeypatch):
    """A BM25 index kept as a snapshot (bm25.index) is read on reopen without tokenising or
    decoding any result's tokens; its scores equal bm25s's rebuilt over the corpus, for a corpus
    that grew and one that lost members (whose tokens are then read)."""
    from historygraph.policies.baselines.retrieval import BM25_SNAPSHOT, bm25_index, bm25_scores

    monkeypatch.setattr(derived_mod, "SNAPSHOT_MIN", 4)
    path = tmp_path / "s.sqlite"
    s = SQLiteStore(path)
    s.create_session("s")
    s.append("s", EVENTS[:7])
    bm25_index(s.graph("s")).scores(s.graph("s"), [2, 4], "parse_date tests")
    s.close()
    s = SQLiteStore(path)
    s.append("s", EVENTS[7:])
    g = s.graph("s")
    contents = {p: g.messages[p].content for p in g.results()}
    calls = []
    monkeypatch.setattr("historygraph.policies.baselines.retrieval._bm25_tokens", lambda texts, real=__import__(
        "historygraph.policies.baselines.retrieval", fromlist=["x"])._bm25_tokens: calls.append(texts) or real(texts))
    idx = bm25_index(g)
    got = idx.scores(g, [2, 4, 6], "parse_date tests")
    assert got.tolist() == bm25_scores([contents[p] for p in (2, 4, 6)], "parse_date tests").tolist()
    assert calls == [["parse_date tests"], [EVENTS[6].content]]  # the query and 6 (never indexed); 2, 4 from the snapshot
    assert sorted(idx.tokens) == [6] and idx.kept == 9  # (9 ≥ 1.25 × 7: a new snapshot put)
    got = idx.scores(g, [4, 6, 8], "DATE_RE passed")
    assert got.tolist() == bm25_scores([contents[p] for p in (4, 6, 8)], "DATE_RE passed").tolist()
    s.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM derived WHERE kind = ?", (BM25_SNAPSHOT.name,)).fetchone() == (1,)


@pytest.mark.parametrize("a", [[0.0, 1.0, 1.0], [0.5, 1.0], [-0.0, 1.0], [float("nan"), 1.0], [], [[1.5, 2.0]]])
def test_snapshot_arrays_come_back_byte_for_byte(a):
    """learned's snapshot arrays (float flags stored as uint8, row numbers as int32 when that gives
    the same bytes back; -0.0 and NaN as they are)."""
    for dtype in (np.float64, np.int64):
        x = np.array(a, dtype=np.float64).astype(dtype) if dtype is np.float64 or not np.isnan(np.array(a, dtype=float)).any() \
            else np.zeros(0, dtype)
        y = derived_mod.unpack_array(derived_mod.pack_array(x))
        assert (y.dtype, y.shape, y.tobytes()) == (x.dtype, x.shape, x.tobytes())
    big = np.array([2**40, 1], dtype=np.int64)
    assert derived_mod.pack_array(big)[3] == "<i8" and derived_mod.unpack_array(derived_mod.pack_array(big)).tolist() == [2**40, 1]


def test_a_learned_snapshot_of_other_results_is_not_used(monkeypatch):
    """A learned.graph snapshot whose results are not the graph's first results (here: forged,
    or another encoding), or that is not of the snapshot's shape (a field missing, an array
    whose bytes are not base64), is not used: the state is built from the messages."""
    monkeypatch.setattr(derived_mod, "SNAPSHOT_MIN", 4)
    counter = TokenCounter()
    g = ContextGraph("s", EVENTS, derived=Derived(persist=True))
    want = features_mod.feature_matrix(g, g.results(), counter)
    rows, _ = g.derived.take()
    (snap,) = [r for r in rows if r[0] == FACTS_SNAPSHOT.name]
    data = json.loads(snap[3])
    no_reuse = {k: v for k, v in data.items() if k != "reuse_read"}
    for forged_data in ({**data, "rows": [2, 4, 7, 8]}, {**data, "encoding": "cl100k_base"}, no_reuse,
                        {**data, "turn": [*data["turn"][:2], "not base64!", data["turn"][3]]}):
        forged = [r if r is not snap else (*r[:3], json.dumps(forged_data)) for r in rows]
        g2 = ContextGraph("s", EVENTS, derived=Derived(forged, persist=True))
        assert features_mod.feature_matrix(g2, g2.results(), counter).tobytes() == want.tobytes()
        assert features_mod.graph_facts(g2, counter).facts.lazy == []  # built, not read
    g3 = ContextGraph("s", EVENTS, derived=Derived(rows, persist=True))
    assert features_mod.graph_facts(g3, counter).facts.lazy == [2, 4, 6, 8]  # the real one is read


def test_take_value_reads_one_row_and_drops_other_versions():
    kind = DerivedKind("k", ("historygraph.history.derived",))
    rows = [("k", kind.version, 0, "[1]"), ("k", kind.version, 5, "[2]"), ("k", "old", 0, "[9]")]
    d = Derived(rows, persist=True)
    assert d.take_value(kind, 5) == [2] and d.take_value(kind, 5) is None  # taken out
    assert d.take() == ([], [("k", kind.version)])  # the old version's rows are deleted at the next write
    assert d.table(kind) == {0: [1]}
    assert Derived(rows).take_value(kind, 0) == [1]


def test_token_counts_start_from_their_snapshot(tmp_path, monkeypatch):
    """The token memo kept as a snapshot (render.memo) is read on reopen: no per-message count row
    before its length is decoded, the rows after it are read one by one, and the counts and the
    layout equal a fresh graph's (here with a marked row to show where a count came from)."""
    from historygraph.render import Layout, placeholder_for
    from historygraph.render._memo import token_memo, token_rows, token_snapshot

    monkeypatch.setattr(derived_mod, "SNAPSHOT_MIN", 4)
    c = TokenCounter()
    kind = token_rows(True, c.encoding_name, placeholder_for)
    path = tmp_path / "s.sqlite"
    s = SQLiteStore(path)
    s.create_session("s")
    s.append("s", EVENTS[:7])
    Layout(s.graph("s"), c, None)
    s.close()
    with sqlite3.connect(path) as db:
        (data,) = db.execute("SELECT data FROM derived WHERE kind = ?", (token_snapshot(kind).name,)).fetchone()
        # a per-message row the snapshot covers: not read (the snapshot's count is used)
        db.execute("UPDATE derived SET data = '777' WHERE kind = ? AND position = 1", (kind.name,))
    assert json.loads(data)["upto"] == 7
    s = SQLiteStore(path)
    s.append("s", EVENTS[7:])
    g = s.graph("s")
    lay = Layout(g, c, None)
    memo = token_memo(g, c, placeholder_for)
    assert memo.kept == 9 and memo.one_by_one  # started from the snapshot of 7; 9 ≥ 1.25 × 7: a new one put
    assert kind.name in g.derived._raw  # the per-message rows of the first 7 not decoded
    fresh = ContextGraph("s", EVENTS)
    want = Layout(fresh, c, None)
    assert lay._tokens == want._tokens == [c.count_message(m) for m in EVENTS]
    assert lay.full_cost == want.full_cost and lay.placeholder_tokens == want.placeholder_tokens
    assert list(lay.units) == list(want.units) and lay.base_tokens == want.base_tokens
    s.close()


def test_a_token_snapshot_of_other_results_is_not_used(monkeypatch):
    """A render.memo snapshot whose tool results are not the graph's (forged), that is longer than
    the graph or malformed is not used: the counts come from the per-message rows or are counted."""
    from historygraph.history.derived import pack_array
    from historygraph.render import Layout, placeholder_for
    from historygraph.render._memo import token_memo, token_rows, token_snapshot

    monkeypatch.setattr(derived_mod, "SNAPSHOT_MIN", 4)
    c = TokenCounter()
    snap_kind = token_snapshot(token_rows(True, c.encoding_name, placeholder_for))
    g = ContextGraph("s", EVENTS, derived=Derived(persist=True))
    want = Layout(g, c, None)
    rows, _ = g.derived.take()
    (snap,) = [r for r in rows if r[0] == snap_kind.name]
    data = json.loads(snap[3])
    changes = [{"tools": pack_array(np.array([2, 4, 5, 8]))}, {"upto": 99}, {"tokens": pack_array(np.arange(3))},
               {"result": "x"}]
    for change in changes:
        forged = [(*r[:3], json.dumps({**data, **change})) if r is snap else r for r in rows]
        forged = [r for r in forged if not r[0].startswith("render.tokens:")]  # no per-message rows: counted
        g2 = ContextGraph("s", EVENTS, derived=Derived(forged, persist=True))
        lay = Layout(g2, c, None)
        assert not token_memo(g2, c, placeholder_for).one_by_one, change
        assert (lay._tokens, lay.full_cost, lay.placeholder_tokens) == (want._tokens, want.full_cost, want.placeholder_tokens)
    g3 = ContextGraph("s", EVENTS, derived=Derived(rows, persist=True))
    Layout(g3, c, None)
    assert token_memo(g3, c, placeholder_for).one_by_one  # the real one is read


def test_brief_savings_start_from_their_snapshot(monkeypatch):
    """The brief views' savings kept as a snapshot (render.briefs) are read whole on reopen and
    equal a fresh graph's; one that saves tokens at a message without a brief view (forged), or
    holds more messages than the graph, is not used."""
    from historygraph.history.derived import pack_array
    from historygraph.render._memo import brief_rows, brief_savings, brief_snapshot, savings_kept

    monkeypatch.setattr(derived_mod, "SNAPSHOT_MIN", 4)
    c = TokenCounter()
    snap_kind = brief_snapshot(brief_rows(True, c.encoding_name))
    events = EVENTS[:1] + [Message("assistant", "look at the dates module " * 40, EVENTS[1].tool_calls)] + EVENTS[2:]
    g = ContextGraph("s", events, derived=Derived(persist=True))
    want = brief_savings(g, c).tolist()
    assert any(want)
    rows, _ = g.derived.take()
    (snap,) = [r for r in rows if r[0] == snap_kind.name]
    rows = [r for r in rows if not r[0].startswith("render.brief:")]  # no per-message rows: computed when not read
    g2 = ContextGraph("s", events, derived=Derived(rows, persist=True))
    assert brief_savings(g2, c).tolist() == want and savings_kept(g2)[c.encoding_name] == (len(events), True)
    data = json.loads(snap[3])
    for change in ({"saved": pack_array(np.array([5] + want[1:]))}, {"upto": 99}, {"saved": "x"}):
        forged = [(*r[:3], json.dumps({**data, **change})) if r is snap else r for r in rows]
        g3 = ContextGraph("s", events, derived=Derived(forged, persist=True))
        assert brief_savings(g3, c).tolist() == want and not savings_kept(g3)[c.encoding_name][1], change


def test_results_embedding_keys_are_read_instead_of_hashing_the_results(tmp_path, monkeypatch):
    """ContextRender's result vectors on a reopened session: each result's content key (sha256 of
    the model name, NUL, its first ``clip`` characters) is a stored row, so the embedder's memo is
    read without hashing a result text; a row is used only for the clip it was made with."""
    import hashlib

    from historygraph.policies.contextrender import result_keys, result_vectors
    from historygraph.signals import embeddings as emb_mod
    from historygraph.signals.embeddings import CachedEmbedder

    class Len:
        model, dim = "len", 2

        def embed(self, texts):
            return np.array([[len(t), 1.0] for t in texts], dtype=np.float32)

    path = tmp_path / "s.sqlite"
    s = SQLiteStore(path)
    s.create_session("s")
    s.append("s", EVENTS)
    emb = CachedEmbedder(Len())
    g = s.graph("s")
    results = g.results()
    want, q = result_vectors(g, results, emb, 20, ["query"])
    assert want[:, 0].tolist() == [20, 20, 0, 20] and q.tolist() == [[5, 1]]
    s.close()
    with sqlite3.connect(path) as db:
        rows = dict(db.execute("SELECT position, data FROM derived WHERE kind = ?", (result_keys("len", 20).name,)).fetchall())
    assert rows == {p: json.dumps(hashlib.sha256(f"len\0{EVENTS[p].content[:20]}".encode()).hexdigest()) for p in (2, 4, 6, 8)}
    hashed: list[str] = []
    real_key = emb_mod.content_key
    monkeypatch.setattr(emb_mod, "content_key", lambda model, text: hashed.append(text) or real_key(model, text))
    emb._keys.clear()  # as in a process whose key memo was dropped: the results' new strings not in it
    s = SQLiteStore(path)
    got, q2 = result_vectors(s.graph("s"), results, emb, 20, ["query"])
    assert (got == want).all() and (q2 == q).all() and hashed == ["query"] and emb.calls == 5
    hashed.clear()
    result_vectors(s.graph("s"), results, emb, 30, [])  # another clip: no stored row is used for it
    assert hashed == [EVENTS[p].content[:30] for p in results]
    s.close()


def test_tfa_scores_start_from_their_snapshot(tmp_path, monkeypatch):
    """A reopened graph takes the TFA scores c_t of the stored snapshot (taken at 7 messages) and
    sums again only those of results touched after it: message 7 reuses ``test_dates.py`` of the
    result at 4, and the result at 8 holds that value too; 8 is new. The scores equal a fresh
    graph's, bit for bit."""
    from historygraph.history.graph import TFA_SCORES

    monkeypatch.setattr(derived_mod, "SNAPSHOT_MIN", 4)
    path = tmp_path / "s.sqlite"
    s = SQLiteStore(path)
    s.create_session("s")
    s.append("s", EVENTS[:7])
    g = s.graph("s")
    assert g.reuse_scores(g.results()) == [3.0, 0.0, 0.0]  # parse_date, DATE_RE, v2_0_1 of 2: used by 5, each n_t = 1
    s.append("s", EVENTS[7:])
    s.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM derived WHERE kind = ?", (TFA_SCORES.name,)).fetchone() == (1,)

    class Asked(dict):
        def get(self, k, default=None):
            asked.append(k)
            return super().get(k, default)
    asked: list[int] = []
    s = SQLiteStore(path)
    g2 = s.graph("s")
    g2.reuse._match_holders = Asked(g2.reuse._match_holders)
    fresh = ContextGraph("s", EVENTS)
    want = [fresh.reuse_score(p) for p in (2, 4, 6, 8)]
    assert g2.reuse_scores([2, 4, 6, 8]) == want and asked == [4, 8]
    s.close()
