"""The learned selector: render-time features (hand-computed), the knapsack (solved by hand), the
model file, fitting, and the clairvoyant bounds (oracle, oracle-omit) with their refusal outside replay."""

import json
import math

import numpy as np
import pytest

from historygraph.eval.replay import replay_trace
from historygraph.history.events import Message, ToolCall, Trace
from historygraph.policies.learned.dataset import trace_examples
from historygraph.policies.learned.features import FEATURES, feature_matrix
from historygraph.policies.learned.result_facts import call_kind
from historygraph.policies.learned.model import ReuseModel, ReuseModelError, TreeReuseModel
from historygraph.policies.learned.train import fit_examples, fit_traces, invocation_sizes, labels, tree_arrays
from historygraph.history.graph import ContextGraph
from historygraph.policies import PolicyError, Signals, create
from historygraph.policies.learned.policy import LearnedConfig, knapsack_select, reuse_values, swap_pass
from historygraph.render import Layout, check_invariants
from historygraph.session import Session


def bash(cid, command):
    return ToolCall(cid, "bash", json.dumps({"command": command}))


def edit_session():
    """Task → cat a file → grep a name (reuses it) → edit the file (reuses both) → the edit failed."""
    return [
        Message("user", "Fix parse_date in utils/dates.py"),
        Message("assistant", "", (bash("c1", "cat utils/dates.py"),)),
        Message("tool", "def parse_date(s):\n    return DATE_RE.match(s)", tool_call_id="c1"),
        Message("assistant", "", (bash("c2", "grep -rn parse_date ."),)),
        Message("tool", "utils/dates.py:1:def parse_date(s):", tool_call_id="c2"),
        Message("assistant", "Now edit parse_date", (bash("c3", "sed -i 's/match/fullmatch/' utils/dates.py"),)),
        Message("tool", "<returncode>1</returncode>\nsed: can't read", tool_call_id="c3"),
    ]


def test_features_on_a_hand_made_session():
    g = ContextGraph("f", edit_session())
    counter = Signals().counter
    X = feature_matrix(g, [2, 4, 6], counter)
    f = [dict(zip(FEATURES, row)) for row in X]
    # result 2 (cat): turn 1 of 3 -> age 2; TFA: parse_date reused by turns 2 and 3, held by results 2 and 4
    # (n = 2), so c = 1/2 + 1/2 = 1; values {parse_date, DATE_RE.match}, the second held by no other result
    assert f[0]["age"] == 2 and f[0]["recency"] == pytest.approx(math.exp(-0.6))
    assert f[0]["reuse_score"] == pytest.approx(math.log(2)) and f[0]["reuse_turns"] == pytest.approx(math.log(3))
    assert (f[0]["reused_last"], f[0]["reused_recent"], f[0]["since_reuse"], f[0]["never_reused"]) == (1, 2, 0, 0)
    assert f[0]["latest_values"] == pytest.approx(math.log(2)) and f[0]["task_values"] == pytest.approx(math.log(2))
    assert f[0]["unique_values"] == pytest.approx(math.log(2)) and f[0]["log_values"] == pytest.approx(math.log(3))
    assert (f[0]["kind_view"], f[0]["superseded"], f[0]["edited_later"], f[0]["path_in_latest"]) == (1, 0, 1, 1)
    assert (f[0]["error"], f[0]["latest_result"]) == (0, 0)
    # identifiers {parse_date, DATE_RE}, both first held here; parse_date named by turns 2 and 3 and the task
    assert f[0]["own_values"] == pytest.approx(math.log(3)) and f[0]["own_idents"] == pytest.approx(math.log(3))
    assert f[0]["ident_turns"] == pytest.approx(math.log(3)) and f[0]["recent_own_idents"] == pytest.approx(math.log(3))
    assert f[0]["latest_idents"] == f[0]["latest_own_idents"] == f[0]["task_idents"] == pytest.approx(math.log(2))
    # result 4 (grep): age 1; dates.py (held only by it) reused by turn 3 -> c = 1
    assert f[1]["age"] == 1 and f[1]["kind_search"] == 1 and f[1]["reuse_score"] == pytest.approx(math.log(2))
    assert (f[1]["reused_last"], f[1]["since_reuse"], f[1]["edited_later"]) == (1, 0, 0)
    assert f[1]["own_values"] == pytest.approx(math.log(2)) and f[1]["own_idents"] == 0  # parse_date came from 2
    # result 6 (sed -i): age 0, never reused, an error, the latest call's result, no TFA values
    assert (f[2]["age"], f[2]["never_reused"], f[2]["kind_edit"], f[2]["error"], f[2]["latest_result"]) == (0, 1, 1, 1, 1)
    assert f[2]["since_reuse"] == pytest.approx(math.log(2)) and f[2]["log_values"] == 0


def test_echo_features_on_a_hand_made_session():
    """A traceback (the newest result) repeats values and the file of an earlier view."""
    msgs = [
        Message("user", "Fix the date parser"),
        Message("assistant", "", (bash("c1", "cat utils/dates.py"),)),
        Message("tool", "def parse_date(s):\n    return DATE_RE.match(s)", tool_call_id="c1"),
        Message("assistant", "", (bash("c2", "python reproduce.py"),)),
        Message("tool", 'Traceback (most recent call last):\n  File "utils/dates.py", line 2, in parse_date\n'
                        "    return DATE_RE.match(s)\nAttributeError: no", tool_call_id="c2"),
    ]
    f = [dict(zip(FEATURES, row)) for row in feature_matrix(ContextGraph("e", msgs), [2, 4], Signals().counter)]
    # result 2 holds (first) the TFA values parse_date and DATE_RE.match and the identifiers
    # parse_date and DATE_RE; the traceback repeats all four and names utils/dates.py, which c1 viewed
    assert f[0]["echo_values"] == f[0]["echo_own_values"] == pytest.approx(math.log(3))
    assert f[0]["echo_own_idents"] == pytest.approx(math.log(3)) and f[0]["echo_files"] == 1
    # the newest result itself: no echo
    assert (f[1]["echo_values"], f[1]["echo_own_values"], f[1]["echo_own_idents"], f[1]["echo_files"]) == (0, 0, 0, 0)


def test_features_extend_incrementally_as_the_graph_grows():
    msgs = edit_session()
    g = ContextGraph("inc", msgs[:3])
    counter = Signals().counter
    feature_matrix(g, [2], counter)  # caches facts for the first result
    g.extend(msgs[3:])
    assert np.array_equal(feature_matrix(g, [2, 4, 6], counter), feature_matrix(ContextGraph("fresh", msgs), [2, 4, 6], counter))


def test_member_sums_from_postings_and_recent_entries_equal_adding_each_rows_terms_in_order(monkeypatch):
    """_Flat.sums reads the postings of the queried members for rows indexed so far and the entries
    added since: per row, the same float as adding the weights of its members left to right in
    the query's order (here: members added in sorted order, queried in sorted order), before any
    index, with one, and with rows added after it; own-only sums count the members first held."""
    from historygraph.policies.learned import flat_tables as fx

    monkeypatch.setattr(fx, "_INDEX_MIN", 8)
    rng = np.random.default_rng(5)
    words = [f"w{i:02d}" for i in range(30)]
    flat, sets, seen, owns, states = fx.Flat(), [], set(), [], set()
    query = sorted(rng.choice(words, 12, replace=False).tolist())
    idf = {w: float(rng.uniform(0.1, 3.0)) for w in words}

    def by_hand(row_set, own=None):
        acc = 0.0
        for w in query:  # left to right from 0.0, in the query's (sorted) order
            if w in row_set and (own is None or w in own):
                acc += idf[w]
        return acc

    for row in range(40):
        members = sorted(set(rng.choice(words, int(rng.integers(1, 9))).tolist()))
        own = frozenset(m for m in members if m not in seen)
        seen |= own
        flat.add(row, members, own)
        sets.append(members)
        owns.append(own)
        if row % 3 == 0:
            ids = flat.lookup(query)
            w = np.array([idf[m] for m in query if m in flat.vocab])
            got = flat.sums(ids, row + 1, w)
            assert got.tolist() == [by_hand(set(m)) for m in sets]
            assert flat.sums(ids, row + 1, w, own=True).tolist() == [by_hand(set(m), o) for m, o in zip(sets, owns)]
            assert flat.counts().tolist() == [sum(v in m for m in sets) for v in flat.vocab]
            # several queries in one pass (a render's): each row as by hand, the weights 1 by default
            half = flat.lookup(query[:5])
            many = flat.sums_many([(ids, w, False), (ids, w, True), (half, None, False), (half[:0], None, True)], row + 1)
            assert many.tolist() == [[by_hand(set(m)) for m in sets], [by_hand(set(m), o) for m, o in zip(sets, owns)],
                                     [float(len(set(m) & set(query[:5]))) for m in sets], [0.0] * (row + 1)]
            states.add("none" if not flat._indexed else "all" if flat._indexed == flat.ids.n else "both")
    assert states == {"none", "all", "both"}  # before the first index, just after one, with rows added since


@pytest.mark.parametrize("name, args, kind", [
    ("bash", {"command": "cat src/a.py"}, "view"), ("bash", {"command": "sed -n '10,20p' a.py"}, "view"),
    ("bash", {"command": "grep -rn foo ."}, "search"), ("bash", {"command": "find . -name '*.py'"}, "search"),
    ("bash", {"command": "sed -i 's/a/b/' a.py"}, "edit"), ("bash", {"command": "cat > a.py << 'EOF'\nx\nEOF"}, "edit"),
    ("bash", {"command": "python -m pytest tests/test_a.py"}, "test"), ("bash", {"command": "python setup.py build"}, "run"),
    ("str_replace_editor", {"command": "view", "path": "/r/a.py"}, "view"),
    ("str_replace_editor", {"command": "str_replace", "path": "/r/a.py"}, "edit"),
    ("get_user_details", {"user_id": "u1"}, "other"),
])
def test_call_kind(name, args, kind):
    assert call_kind(name, json.dumps(args)) == kind


def layout_with_results(sizes, budget=None):
    """One step per result; the latest assistant message holds no call. Returns (layout, positions)."""
    msgs = [Message("user", "task")]
    for i, n in enumerate(sizes):
        msgs += [Message("assistant", "", (bash(f"c{i}", "ls"),)), Message("tool", "word " * n, tool_call_id=f"c{i}")]
    msgs.append(Message("assistant", "thinking"))
    g = ContextGraph("k", msgs)
    lay = Layout(g, Signals().counter, budget)
    return lay, lay.candidates


def test_knapsack_prefers_value_per_token_over_the_largest_value():
    lay, (a, b, c, d) = layout_with_results([900, 300, 300, 300])
    room = lay.delta[a]  # exactly A alone, or B + C + D (each a third of A's size)
    assert lay.delta[b] + lay.delta[c] + lay.delta[d] <= room
    lay, _ = layout_with_results([900, 300, 300, 300], budget=lay.base_tokens + room)
    value = {a: 0.9, b: 0.5, c: 0.5, d: 0.45}
    sel = lay.selection()
    # by hand: A alone is worth 0.9; B, C, D together fit and are worth 1.45 (the optimum)
    assert sorted(knapsack_select([a, b, c, d], value, sel)) == [b, c, d]


def test_knapsack_first_takes_results_smaller_than_their_placeholders():
    """A one-word result B costs fewer tokens shown than as its placeholder (Δb < 0). With room for
    A only once B is shown, taking B first (it frees |Δb| tokens) lets A in; by ratio alone A would
    be met first, not fit, and be left out (as a τ-bench rendering at B = 3000 did)."""
    lay, (a, b) = layout_with_results([300, 1])
    assert lay.delta[b] < 0 < lay.delta[a]
    lay, _ = layout_with_results([300, 1], budget=lay.base_tokens + lay.delta[a] + lay.delta[b])
    sel = lay.selection()
    assert knapsack_select([a, b], {a: 0.5, b: 0.01}, sel, 0.5) == [b, a]
    assert sel.used == lay.base_tokens + lay.delta[a] + lay.delta[b]


def test_knapsack_swaps_in_a_single_item_worth_more_than_the_greedy_set():
    lay, (a, b) = layout_with_results([900, 60])
    room = lay.delta[a] + lay.delta[b] - 1  # both do not fit
    lay, _ = layout_with_results([900, 60], budget=lay.base_tokens + room)
    sel = lay.selection()
    # by hand: B has the best ratio and is taken first; A then does not fit; A alone (0.9) beats {B} (0.1)
    assert knapsack_select([a, b], {a: 0.9, b: 0.1}, sel) == [a]
    assert sel.used == lay.base_tokens + lay.delta[a]


def test_swap_pass_trades_one_shown_result_for_two_worth_more_in_the_room_it_frees():
    lay, (a, b, c) = layout_with_results([900, 300, 300])
    assert lay.delta[b] + lay.delta[c] <= lay.delta[a]
    lay, _ = layout_with_results([900, 300, 300], budget=lay.base_tokens + lay.delta[a])
    value = np.array([0.55, 0.3, 0.3])
    sel = lay.selection()
    # by hand, ratio p / cost^0.5: A 0.55 / √Δa ranks first and fills the budget, B and C no longer fit
    assert knapsack_select([a, b, c], value, sel, 0.5) == [a]
    # B + C (0.6) are worth more than A (0.55) and cost no more than removing A frees
    assert swap_pass(sel, [a], value, pairs=3) == [b, c]
    assert sel.used == lay.base_tokens + lay.delta[b] + lay.delta[c] and set(sel.shown) == {b, c}
    # pairs=0 leaves the greedy selection as it is; so does an exchange worth less (A at 0.65)
    sel = lay.selection()
    assert swap_pass(sel, knapsack_select([a, b, c], value, sel, 0.5), value, pairs=0) == [a]
    worth_more = np.array([0.65, 0.3, 0.3])
    sel = lay.selection()
    assert swap_pass(sel, knapsack_select([a, b, c], worth_more, sel, 0.5), worth_more, pairs=3) == [a]
    assert set(sel.shown) == {a}


def test_swap_pass_never_grows_the_history_and_shows_what_a_fresh_selection_of_its_set_shows():
    """On a long session with dropped steps brought back, at several budgets and value orders: the
    exchange's history is no longer than the greedy one's, and its Selection is the one re-taking
    its positions gives (costs, revived steps and shown forms)."""
    rng = np.random.default_rng(1)
    msgs = [Message("user", "Fix the bug")]
    for i, n in enumerate(rng.integers(10, 400, size=16).tolist()):
        msgs += [Message("assistant", f"Step {i}. " + "reasoning " * 40, (bash(f"c{i}", f"cat f{i}.py"),)),
                 Message("tool", f"Result_{i} " + "data " * n, tool_call_id=f"c{i}")]
    g = ContextGraph("sw", msgs + [Message("assistant", "next")])
    sig = Signals()
    swapped = 0
    for budget in (900, 1500, 3000):
        lay = Layout(g, sig.counter, budget, result_reserve=0.95, brief_revivals=True)
        for _ in range(20):
            value = rng.random(len(lay.candidates))
            sel = lay.selection()
            greedy = knapsack_select(lay.candidates, value, sel, 0.5)
            before = sel.used
            shown = swap_pass(sel, greedy, value, pairs=3)
            again = lay.selection()
            for p in shown:
                again.take(p)
            assert sel.used <= before and (sel.used, sel.revived, sel.shown) == (again.used, again.revived, again.shown)
            swapped += shown != greedy
    assert swapped > 0


def test_knapsack_never_takes_worthless_results():
    lay, (a, b) = layout_with_results([50, 50], budget=100_000)
    assert knapsack_select([a, b], {a: 0.0, b: 0.3}, lay.selection()) == [b]


def test_by_default_results_below_two_in_a_thousand_stay_out_with_room_left():
    lay, (a, b, c) = layout_with_results([50, 50, 50], budget=100_000)  # room for all three
    value = reuse_values(lay, np.array([0.0019, 0.002, 0.3]), LearnedConfig())
    assert value.tolist() == [0.0, 0.002, 0.3]  # 0 below min_probability (0.002), kept from it on
    assert sorted(knapsack_select([a, b, c], value, lay.selection())) == [b, c]
    everything = reuse_values(lay, np.array([0.0019, 0.002, 0.3]), LearnedConfig(min_probability=0.0))
    assert sorted(knapsack_select([a, b, c], everything, lay.selection())) == [a, b, c]


def test_knapsack_refuses_a_position_that_is_not_a_candidate():
    lay, (a, b) = layout_with_results([50, 50], budget=100_000)
    with pytest.raises(ValueError, match="candidates of the selection's layout"):
        knapsack_select([a, b + 1], {a: 0.5, b + 1: 0.5}, lay.selection())  # b + 1: the next assistant message


def test_model_round_trip_and_clear_errors(tmp_path):
    m = ReuseModel.load()  # the shipped default
    assert m.features == list(FEATURES)
    path = tmp_path / "m.json"
    m.save(path)
    again = ReuseModel.load(path)
    X = np.random.default_rng(0).normal(size=(5, len(FEATURES)))
    assert np.allclose(again.predict(X), m.predict(X), atol=1e-6)
    bad = json.loads(path.read_text()) | {"features": list(FEATURES)[:-1]}
    path.write_text(json.dumps(bad))
    with pytest.raises(ReuseModelError, match="features differ"):
        ReuseModel.load(path)
    path.write_text("{}")
    with pytest.raises(ReuseModelError, match="not a historygraph reuse model"):
        ReuseModel.load(path)
    with pytest.raises(ReuseModelError, match="cannot read"):
        ReuseModel.load(tmp_path / "missing.json")


def two_trees(calibration=(2.0, -1.0)):
    """Tree 0: age ≤ 3 → 0.5, else (reuse_turns ≤ 0.5 → −1, else 0.25); tree 1: a single leaf 0.1."""
    age, turns = FEATURES.index("age"), FEATURES.index("reuse_turns")
    #                    0: age≤3  1: leaf 2: turns≤.5 3: leaf 4: leaf 5: leaf (tree 1)
    return TreeReuseModel(list(FEATURES), np.array([0, 5]), np.array([age, -1, turns, -1, -1, -1]),
                          np.array([3.0, 0, 0.5, 0, 0, 0]), np.array([1, -1, 3, -1, -1, -1]),
                          np.array([2, -1, 4, -1, -1, -1]), np.array([0.5, 0.5, 0, -1.0, 0.25, 0.1]), calibration)


def test_tree_model_sums_the_leaves_each_row_reaches_and_calibrates_them(tmp_path):
    m = two_trees()
    X = np.zeros((4, len(FEATURES)))
    X[:, FEATURES.index("age")] = [3, 3.5, 10, 10]  # 3 ≤ 3 goes left
    X[:, FEATURES.index("reuse_turns")] = [9, 0.5, 0.5, 0.7]
    # scores by hand: 0.5 + 0.1, −1 + 0.1, −1 + 0.1, 0.25 + 0.1; p = 1 / (1 + e^−(2s − 1))
    assert np.allclose(m.score(X), [0.6, -0.9, -0.9, 0.35])
    assert np.allclose(m.predict(X), [1 / (1 + math.exp(-(2 * s - 1))) for s in (0.6, -0.9, -0.9, 0.35)])
    m.save(tmp_path / "t.json")
    again = ReuseModel.load(tmp_path / "t.json")
    assert isinstance(again, TreeReuseModel) and np.array_equal(again.predict(X), m.predict(X))
    bad = json.loads((tmp_path / "t.json").read_text())
    bad["left"][0] = 9  # a child outside the node arrays
    (tmp_path / "t.json").write_text(json.dumps(bad))
    with pytest.raises(ReuseModelError, match="inconsistent tree arrays"):
        ReuseModel.load(tmp_path / "t.json")
    del bad["roots"]
    (tmp_path / "t.json").write_text(json.dumps(bad))
    with pytest.raises(ReuseModelError, match="incomplete tree model"):
        ReuseModel.load(tmp_path / "t.json")


def deep_tree_and_leaf():
    """Tree 0: age ≤ 5 → (turns ≤ 1 → 1.0, else 2.0), else (turns ≤ 2 → (age ≤ 8 → 3.0, else 3.5),
    else 4.0); tree 1: a single leaf 0.25."""
    age, turns = FEATURES.index("age"), FEATURES.index("reuse_turns")
    #          0: age≤5  1: turns≤1  2: leaf 3: leaf 4: turns≤2  5: age≤8  6: leaf 7: leaf 8: leaf 9: leaf (tree 1)
    feature = [age, turns, -1, -1, turns, age, -1, -1, -1, -1]
    threshold = [5.0, 1.0, 0, 0, 2.0, 8.0, 0, 0, 0, 0]
    left = [1, 2, -1, -1, 5, 6, -1, -1, -1, -1]
    right = [4, 3, -1, -1, 8, 7, -1, -1, -1, -1]
    value = [0, 0, 1.0, 2.0, 0, 0, 3.0, 3.5, 4.0, 0.25]
    return TreeReuseModel(list(FEATURES), np.array([0, 9]), np.array(feature), np.array(threshold), np.array(left),
                          np.array(right), np.array(value), (1.0, 0.0))


def test_leaf_masks_find_the_leaf_each_row_reaches_as_the_walk_does():
    m = deep_tree_and_leaf()
    assert m._masks is not None and m._masks.width == 16
    X = np.zeros((8, len(FEATURES)))
    X[:, FEATURES.index("age")] = [5, 5, 6, 9, 9, np.nan, -0.0, np.inf]
    X[:, FEATURES.index("reuse_turns")] = [1, 1.5, 2, 2, 3, np.nan, 7, -np.inf]
    # by hand: (5, 1) left, left: 1.0; (5, 1.5) 2.0; (6, 2) right, left, left: 3.0; (9, 2) 3.5; (9, 3): every
    # test fails, only the rightmost leaf 4.0 is ruled out by none; NaN goes left everywhere: 1.0;
    # (−0, 7) 2.0; (∞, −∞) right, left, right: 3.5; each plus tree 1's 0.25
    expected = [1.25, 2.25, 3.25, 3.75, 4.25, 1.25, 2.25, 3.75]
    assert m.score(X).tolist() == expected
    assert m.score_levels(X).tolist() == expected
    assert m.score(X[:0]).shape == (0,)


@pytest.mark.parametrize("leaves, width", [(20, 32), (40, 64), (70, None)])
def test_leaf_masks_widen_with_the_leaves_and_trees_beyond_64_leaves_are_walked(leaves, width):
    # one chain: node k (k = 0 … leaves − 2) sends age ≤ k to a leaf of value k, else to node k + 1; the
    # last right leaf is worth leaves − 1: a row of age a reaches ceil(a) for 0 ≤ a ≤ leaves − 2
    age = FEATURES.index("age")
    n = 2 * leaves - 1  # nodes: split k at 2k, its left leaf at 2k + 1, the last leaf at 2(leaves − 1)
    feature, threshold, left, right, value = [-1] * n, [0.0] * n, [-1] * n, [-1] * n, [0.0] * n
    for k in range(leaves - 1):
        feature[2 * k], threshold[2 * k], left[2 * k], right[2 * k] = age, float(k), 2 * k + 1, 2 * k + 2
        value[2 * k + 1] = float(k)
    value[n - 1] = float(leaves - 1)
    m = TreeReuseModel(list(FEATURES), np.array([0]), np.array(feature), np.array(threshold), np.array(left),
                       np.array(right), np.array(value), (1.0, 0.0))
    assert (m._masks.width if m._masks else None) == width
    X = np.zeros((6, len(FEATURES)))
    X[:, age] = [0, 0.5, 3, 12.2, leaves - 2, leaves + 5]
    assert m.score(X).tolist() == [0, 1, 3, 13, leaves - 2, leaves - 1]
    every = np.zeros((leaves, len(FEATURES)))
    every[:, age] = np.arange(leaves)  # age k reaches leaf k: every leaf (every bit position) once
    assert m.score(every).tolist() == list(range(leaves))


def test_a_node_reached_twice_is_refused(tmp_path):
    d = two_trees().to_dict()
    d["roots"] = [0, 2]  # tree 1 would be tree 0's right subtree
    (tmp_path / "t.json").write_text(json.dumps(d))
    with pytest.raises(ReuseModelError, match="a node reached twice"):
        ReuseModel.load(tmp_path / "t.json")


def test_leaf_masks_give_a_fitted_ranker_the_walks_bits_and_lightgbms_scores():
    lightgbm = pytest.importorskip("lightgbm")
    from historygraph.policies.learned.train import TREE_PARAMS
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, len(FEATURES)))
    X[:, :10] = np.round(X[:, :10])  # ties with thresholds, as counts give
    X[:, 10:14] = X[:, 10:14] > 0.5  # 0/1 features: one threshold each
    y = ((X[:, 0] + X[:, 3] * X[:, 11] + rng.normal(size=3000)) > 1).astype(int)
    ranker = lightgbm.LGBMRanker(**{**TREE_PARAMS, "n_estimators": 60, "min_child_samples": 5}).fit(
        X, y, group=[30] * 100)
    roots, feat, thr, left, right, val = tree_arrays(ranker.booster_.dump_model())
    m = TreeReuseModel(list(FEATURES), np.array(roots), np.array(feat), np.array(thr), np.array(left),
                       np.array(right), np.array(val), (1.0, 0.0))
    assert m._masks is not None and len(m._masks.groups) > 1
    Z = rng.normal(size=(2000, len(FEATURES)))
    Z[:500] = X[:500]
    Z[500::7, 2] = np.nan  # beyond the rows compared with LightGBM, which reads NaN as missing
    assert np.array_equal(m.score(Z), m.score_levels(Z))
    assert np.allclose(m.score(Z[:500]), ranker.predict(Z[:500]), rtol=0, atol=1e-9)


def test_a_command_run_again_supersedes_its_earlier_output_only():
    msgs = [Message("user", "Find the config"),
            Message("assistant", "", (bash("c1", "ls -la src"),)), Message("tool", "a.py b.py", tool_call_id="c1"),
            Message("assistant", "", (bash("c2", "ls -la src/"),)), Message("tool", "a.py b.py", tool_call_id="c2"),
            Message("assistant", "", (bash("c3", "ls -la src"),)), Message("tool", "a.py b.py c.py", tool_call_id="c3")]
    X = feature_matrix(ContextGraph("again", msgs), [2, 4, 6], Signals().counter)
    assert X[:, FEATURES.index("superseded")].tolist() == [1.0, 0.0, 0.0]  # c3 re-runs c1; c2 differs by a slash


def test_kept_scores_are_those_of_scoring_afresh_and_follow_the_group_that_moves():
    from historygraph.policies.learned.model import ScoreMemo
    m = ReuseModel.load().models[1]  # the shipped blend's trees (a fitted model with many groups)
    assert isinstance(m, TreeReuseModel) and m._masks is not None
    groups = [g[0] for g in m._masks.groups]
    cover = FEATURES.index("latest_cover")
    moving = next(j for j, g in enumerate(groups) if cover in g)
    rng = np.random.default_rng(1)
    X = np.abs(rng.normal(size=(300, len(FEATURES)))) * rng.choice([0.3, 3, 30], size=(1, len(FEATURES)))
    keys = np.arange(300) * 3 + 7  # a result's position, say
    owner = ContextGraph("memo", [])
    for step in range(6):
        if step:
            X[:, cover] = rng.uniform(size=300)  # every row's cover moves: its cells change in most rows
            X[rng.choice(300, 5, replace=False), FEATURES.index("age")] += 40  # a few rows move elsewhere
        if step == 3:
            X[7, 2] = np.nan  # goes left at every node of its feature
        order = rng.permutation(300)[:250]  # another subset, in another order, at each call
        assert np.array_equal(m.score(X[order], keys[order], owner), m.score(X[order]))
    assert m._memos[owner].open == moving  # the rows whose cells change are re-read through one table row
    assert isinstance(m._memos[owner], ScoreMemo)
    assert np.array_equal(m.predict(X, keys, owner), m.predict(X))


def test_a_blend_is_the_weighted_mean_of_its_members_probabilities(tmp_path):
    from historygraph.policies.learned.model import BlendReuseModel
    k = len(FEATURES)
    coef = np.zeros(k)
    coef[FEATURES.index("age")] = -1.0
    logistic = ReuseModel(list(FEATURES), np.zeros(k), np.ones(k), coef, 0.5)  # p = 1 / (1 + e^−(0.5 − age))
    trees = two_trees()  # p = 1 / (1 + e^−(2s − 1))
    m = BlendReuseModel(list(FEATURES), [logistic, trees], [0.25, 0.75])
    X = np.zeros((2, k))
    X[:, FEATURES.index("age")] = [3, 10]
    X[:, FEATURES.index("reuse_turns")] = [9, 0.7]  # tree scores 0.6 and 0.35 (test above)
    sig = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    expected = [0.25 * sig(0.5 - 3) + 0.75 * sig(2 * 0.6 - 1), 0.25 * sig(0.5 - 10) + 0.75 * sig(2 * 0.35 - 1)]
    assert np.allclose(m.predict(X), expected, rtol=1e-12)
    m.save(tmp_path / "b.json")
    again = ReuseModel.load(tmp_path / "b.json")
    assert isinstance(again, BlendReuseModel) and isinstance(again.models[1], TreeReuseModel)
    assert np.allclose(again.predict(X), expected, rtol=1e-4)
    d = json.loads((tmp_path / "b.json").read_text())
    for bad, match in [({"weights": [0.5, 0.6]}, "sum to 1"), ({"weights": [0.5]}, "as many weights"),
                       ({"models": [d, d["models"][0]]}, "must be a logistic or trees model")]:
        (tmp_path / "x.json").write_text(json.dumps(d | bad))
        with pytest.raises(ReuseModelError, match=match):
            ReuseModel.load(tmp_path / "x.json")


def test_tree_arrays_number_the_nodes_of_every_tree_in_one_sequence():
    leaf = lambda v: {"leaf_value": v}  # noqa: E731
    dump = {"tree_info": [{"tree_structure": {"split_feature": 2, "threshold": 1.5, "decision_type": "<=",
                                              "left_child": leaf(-0.5), "right_child": leaf(0.5)}},
                          {"tree_structure": leaf(0.125)}]}
    assert tree_arrays(dump) == ([0, 3], [2, -1, -1, -1], [1.5, 0.0, 0.0, 0.0], [1, -1, -1, -1], [2, -1, -1, -1],
                                 [0.0, -0.5, 0.5, 0.125])
    dump["tree_info"][0]["tree_structure"]["decision_type"] = "=="
    with pytest.raises(ValueError, match="unsupported split"):
        tree_arrays(dump)


def test_invocation_sizes_are_the_runs_of_one_trace_and_invocation():
    from historygraph.policies.learned.dataset import Examples
    z = np.zeros(6)
    ex = Examples(np.zeros((6, len(FEATURES))), z, z, np.array([0, 0, 0, 1, 1, 1]), np.array([1, 2, 2, 1, 1, 4]), z, z, z)
    assert invocation_sizes(ex).tolist() == [1, 2, 2, 1]


def test_labels_are_observed_reuse_of_tfa():
    ex = trace_examples(Trace("t", "x", "t1", edit_session() + [Message("assistant", "done: DATE_RE.match fixed")]),
                        Signals().counter)
    # invocation 0 (msg 1) has no result before it; then before msg 3 (result 2), 5 (2, 4), 7 (2, 4, 6)
    assert ex.invocation.tolist() == [1, 2, 2, 3, 3, 3]
    # TFA: msg 3 reuses parse_date (result 2); msg 5 reuses parse_date (2) and dates.py (4); msg 7 DATE_RE.match (2)
    assert ex.reused.tolist() == [1, 1, 1, 1, 0, 0]
    assert ex.within.tolist() == [1, 1, 1, 1, 0, 0]
    # identifiers: parse_date (first held by 2) named by msgs 3 and 5; DATE_RE (held by 2) by msg 7
    assert ex.named.tolist() == [1, 1, 0, 1, 0, 0]
    # msg 5 reuses dates.py from result 4 only: a file name, neither a counted value nor an identifier
    assert ex.valued.tolist() == [1, 1, 0, 1, 0, 0]
    # fresh: the task wrote parse_date before any result held it, so msgs 3 and 5 learned nothing new from
    # result 2; DATE_RE.match (msg 7) was in no user or assistant message before result 2
    assert ex.fresh.tolist() == labels(ex, "fresh").tolist() == [0, 0, 0, 1, 0, 0]
    # the recipes: TFA values or identifiers (shipped), values other than file names or identifiers,
    # identifiers alone, TFA alone
    assert labels(ex).tolist() == labels(ex, "reuse-or-named").tolist() == labels(ex, "reuse").tolist() == [1, 1, 1, 1, 0, 0]
    assert labels(ex, "values-or-named").tolist() == labels(ex, "named").tolist() == [1, 1, 0, 1, 0, 0]
    with pytest.raises(ValueError, match="unknown label 'tfa'; choose one of reuse-or-named, values-or-named, named, "
                                         "reuse, fresh"):
        labels(ex, "tfa")


def fit_two_real_traces_twice(tmp_path, traces_dir, objective):
    """Two real mini-swe-agent trajectories, fitted twice with ``objective``: the model (the two
    files are asserted byte-identical), the traces and the token counter."""
    from historygraph.traces import read_traces
    traces = [next(iter(read_traces(traces_dir / "mini-swe-agent-deepseek" / f)))
              for f in ("django__django-11099.traj.json", "marshmallow-code__marshmallow-1359.traj.json")]
    counter = Signals().counter
    model = fit_traces(traces, tmp_path / "a.json", counter, objective=objective)
    fit_traces(traces, tmp_path / "b.json", counter, objective=objective)
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    return model, traces, counter


@pytest.mark.slow
def test_fit_is_deterministic_and_learns_the_direction_of_reuse(tmp_path, traces_dir):
    a, _, _ = fit_two_real_traces_twice(tmp_path, traces_dir, "logistic")
    coef = dict(zip(a.features, a.coef))
    assert coef["reuse_turns"] > 0  # results reused before are reused again


@pytest.mark.slow
def test_lambdarank_fit_is_deterministic_and_reads_as_lightgbm_scores(tmp_path, traces_dir):
    import lightgbm

    from historygraph.policies.learned.train import TREE_PARAMS, examples
    a, traces, counter = fit_two_real_traces_twice(tmp_path, traces_dir, "lambdarank")
    assert isinstance(a, TreeReuseModel) and a.meta["objective"] == "lambdarank" and a.calibration[0] > 0
    ex = examples(traces, counter)
    ranker = lightgbm.LGBMRanker(**TREE_PARAMS).fit(ex.X, labels(ex).astype(int), group=invocation_sizes(ex))
    # the file's leaf values keep 5 significant digits: each of 200 leaves summed is within 5e-6 relative
    assert np.allclose(a.score(ex.X), ranker.predict(ex.X), atol=1e-4)
    assert np.array_equal(a.score(ex.X), a.score_levels(ex.X))


@pytest.mark.slow
def test_blend_fit_is_deterministic_and_its_members_follow_the_recipe(tmp_path, traces_dir):
    from historygraph.policies.learned.model import BlendReuseModel
    from historygraph.policies.learned.train import BLEND, examples
    a, traces, counter = fit_two_real_traces_twice(tmp_path, traces_dir, "blend")
    assert isinstance(a, BlendReuseModel) and a.meta["objective"] == "blend"
    assert [(m.meta.get("objective", "logistic"), m.meta["label"]) for m in a.models] == [(o, lb) for o, lb, _ in BLEND]
    X = examples(traces, counter).X
    assert np.allclose(a.predict(X), sum(w * m.predict(X) for (_, _, w), m in zip(BLEND, a.models)), rtol=1e-12)
    with pytest.raises(ValueError, match="its own label"):
        fit_examples(examples(traces, counter), label="named", objective="blend")


def test_fit_refuses_examples_without_reuse():
    ex = trace_examples(Trace("t", "x", "t1", edit_session()[:3] + [Message("assistant", "nothing reused")]),
                        Signals().counter)
    with pytest.raises(ValueError, match="cannot fit"):
        fit_examples(ex)


def test_fit_with_identifiers_alone_names_the_label_for_agents_without_them():
    """An order-number session: TFA sees the reuse of W123456, the identifier rule sees nothing."""
    msgs = [Message("user", "Cancel my order"),
            Message("assistant", "", (bash("c1", "find_order alice"),)),
            Message("tool", "order W123456 pending", tool_call_id="c1"),
            Message("assistant", "", (bash("c2", "status W123456"),)),
            Message("tool", "pending", tool_call_id="c2"),
            Message("assistant", "Cancelling W123456")]
    ex = trace_examples(Trace("t", "x", "t1", msgs), Signals().counter)
    assert ex.reused.tolist() == ex.valued.tolist() == [1, 1, 0] and ex.named.tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="fit with label 'values-or-named'"):
        fit_examples(ex, label="named", objective="logistic")
    assert fit_examples(ex, objective="logistic").meta["label"] == "reuse-or-named"
    assert fit_examples(ex, label="values-or-named", objective="logistic").meta["reused"] == 2


def test_learned_renders_with_a_tree_model_and_keeps_the_invariants(tmp_path):
    """The hand-made two-tree model: results at most 3 turns old score 0.6, older unreused ones −0.9."""
    two_trees().save(tmp_path / "t.json")
    msgs = [Message("user", "Fix the bug")]
    for i in range(6):
        msgs += [Message("assistant", f"step {i}", (bash(f"c{i}", f"cat file{i}.py"),)),
                 Message("tool", "filler text " * 300, tool_call_id=f"c{i}")]
    msgs.append(Message("assistant", "next", (bash("c9", "ls"),)))
    g = ContextGraph("l", msgs)
    sig = Signals()
    r = create("learned", model=str(tmp_path / "t.json"), reserve_always=False, recent_calls=0).render(g, 2000, sig)
    check_invariants(r, g, sig.counter)
    # with every step kept (they fit), two of the three results at most 3 turns old fit (ties go to
    # the older), none of the older three
    assert sorted(r.full) == [8, 10]
    # with recent_calls=5 the newest steps show their unselected results as short placeholders:
    # c2's (the fourth newest step's) frees the room the third needs
    r = create("learned", model=str(tmp_path / "t.json"), reserve_always=False, recent_calls=5).render(g, 2000, sig)
    check_invariants(r, g, sig.counter)
    assert sorted(r.full) == [8, 10, 12]
    assert [p for m, p in zip(r.messages, r.positions) if m.content.endswith("omitted; restore by id]")] == [6]
    r = create("learned", model=str(tmp_path / "t.json"), recent_calls=0).render(g, 2000, sig)
    check_invariants(r, g, sig.counter)
    # reserve_always: with the steps dropped to the reserve all three fit (worth 3 × 0.6 > 2 × 0.6);
    # the older three steps stand under one marker
    assert sorted(r.full) == [8, 10, 12]
    assert sum(m.rendered_as == "marker" for m in r.messages) == 1


def test_learned_keeps_the_invariants_and_prefers_the_reused_result():
    msgs = [Message("user", "Fix the bug")]
    for i in range(6):
        msgs += [Message("assistant", f"step {i}", (bash(f"c{i}", f"cat file{i}.py"),)),
                 Message("tool", f"VALUE_{i}_TOKEN " + "filler text " * 300, tool_call_id=f"c{i}")]
    msgs.append(Message("assistant", "Use VALUE_0_TOKEN again", (bash("c9", "grep -rn VALUE_0_TOKEN ."),)))
    msgs.append(Message("tool", "file0.py:1: VALUE_0_TOKEN", tool_call_id="c9"))
    g = ContextGraph("l", msgs)
    sig = Signals()
    r = create("learned").render(g, 2000, sig)
    check_invariants(r, g, sig.counter)
    assert 2 in r.full  # the oldest result, reused by the latest call, beats newer unreused ones


def oracle_trace():
    """Four large results; the final turn reuses a token first seen in result 2 (the oldest)."""
    msgs = [Message("user", "task")]
    for i in range(4):
        msgs += [Message("assistant", f"look {i}", (bash(f"c{i}", f"cat f{i}.txt"),)),
                 Message("tool", f"Marker_{i}_Value " + "data " * 400, tool_call_id=f"c{i}")]
    msgs.append(Message("assistant", "The answer is in Marker_0_Value"))
    return Trace("test", "oracle.json", "o1", msgs)


def test_oracle_shows_exactly_what_the_next_turn_reuses():
    tr = oracle_trace()
    sig = Signals()
    policies = {n: create(n, replay=True) for n in ("oracle", "oracle-omit", "prune")}
    # B holds the newest result (c3, shown whatever the selection: invariant §5.9) and one more
    res = replay_trace(tr, policies, 1000, sig)
    assert res.stats["oracle"].events == 1 and res.stats["oracle"].hits == 1
    assert res.stats["oracle-omit"].hits == 1
    assert res.stats["prune"].hits == 0  # keeps the most recent result, not the reused one
    for st in res.stats.values():
        assert st.violations == []


def test_oracle_takes_the_smallest_reused_results_first():
    msgs = [Message("user", "task")]
    sizes = [600, 100, 150]
    for i, n in enumerate(sizes):
        msgs += [Message("assistant", "", (bash(f"c{i}", "ls"),)), Message("tool", "x " * n, tool_call_id=f"c{i}")]
    msgs.append(Message("assistant", "next"))
    g = ContextGraph("o", msgs)
    sig = Signals()
    lay = Layout(g, sig.counter, None)
    big, small, mid = lay.candidates
    oracle = create("oracle", replay=True)
    oracle.upcoming = frozenset({big, small, mid})
    budget = lay.base_tokens + lay.delta[small] + lay.delta[mid] + 10  # room for the two smaller ones only
    # (the big one is over B and offered as a marked excerpt: the cheapest form, but it never counts as shown)
    r = oracle.render(g, budget, sig)
    check_invariants(r, g, sig.counter)
    assert sorted(r.full) == [small, mid]


def test_oracles_are_refused_outside_replay():
    with pytest.raises(PolicyError, match="recorded future"):
        create("oracle")
    with pytest.raises(PolicyError, match="recorded future"):
        create("oracle-omit")
    with pytest.raises(PolicyError, match="recorded future"):
        Session("s", policy="oracle").render()
    unset = create("oracle", replay=True)
    with pytest.raises(PolicyError, match="only `historygraph replay`"):
        unset.render(ContextGraph("x", [Message("user", "u")]), 100, Signals())


def test_fit_command_writes_a_model_that_replay_uses(tmp_path, traces_dir, monkeypatch):
    from typer.testing import CliRunner

    from historygraph.cli import app
    runner = CliRunner()
    src = traces_dir / "mini-swe-agent-deepseek" / "django__django-11099.traj.json"
    out = tmp_path / "m.json"
    res = runner.invoke(app, ["fit", str(src), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert ReuseModel.load(out).meta["traces"] == 1 and ReuseModel.load(out).meta["objective"] == "blend"
    other = tmp_path / "named.json"
    assert runner.invoke(app, ["fit", str(src), "--out", str(other), "--label", "values-or-named",
                               "--objective", "logistic"]).exit_code == 0
    assert ReuseModel.load(other).meta["label"] == "values-or-named"
    trees = tmp_path / "trees.json"
    assert runner.invoke(app, ["fit", str(src), "--out", str(trees), "--objective", "lambdarank"]).exit_code == 0
    assert isinstance(ReuseModel.load(trees), TreeReuseModel) and ReuseModel.load(trees).meta["objective"] == "lambdarank"
    bad = runner.invoke(app, ["fit", str(src), "--out", str(tmp_path / "b.json"), "--objective", "svm"])
    assert bad.exit_code != 0 and "unknown --objective 'svm'; choose one of blend, logistic, lambdarank" \
        in " ".join(bad.output.split())
    wrong = runner.invoke(app, ["fit", str(src), "--out", str(tmp_path / "w.json"), "--label", "tfa"])
    assert wrong.exit_code != 0 and "unknown --label 'tfa'; choose one of reuse-or-named, values-or-named, named, reuse, fresh" \
        in " ".join(wrong.output.split())
    again = runner.invoke(app, ["fit", str(src), "--out", str(out)])
    assert again.exit_code != 0 and "--force" in again.output  # never overwrites silently
    missing = runner.invoke(app, ["fit", str(tmp_path / "nope"), "--out", str(tmp_path / "x.json")])
    assert missing.exit_code != 0 and "no such file" in missing.output
    nested = tmp_path / "new" / "dir" / "m.json"  # a missing folder is created
    assert runner.invoke(app, ["fit", str(src), "--out", str(nested)]).exit_code == 0 and nested.is_file()
    monkeypatch.setenv("HISTORYGRAPH_LEARNED_MODEL", str(out))
    assert create("learned").model.meta["traces"] == 1
    monkeypatch.setenv("HISTORYGRAPH_LEARNED_MODEL", str(tmp_path / "gone.json"))  # the error names where the path came from
    with pytest.raises(ReuseModelError, match=r"cannot read reuse model .*gone\.json.*named by \$HISTORYGRAPH_LEARNED_MODEL"):
        create("learned")


def long_steps(n=8, thought_words=200, result_words=150):
    msgs = [Message("user", "Fix the bug")]
    for i in range(n):
        msgs += [Message("assistant", f"Thinking about step {i}. " + "reasoning " * thought_words, (bash(f"c{i}", f"cat f{i}.py"),)),
                 Message("tool", f"Result_{i}_Value " + "data " * result_words, tool_call_id=f"c{i}")]
    msgs.append(Message("assistant", "Now use Result_0_Value", (bash("cz", "grep Result_0_Value f0.py"),)))
    return msgs


def test_brief_revival_shows_an_old_result_with_its_call_and_a_marked_text():
    msgs = long_steps()
    g = ContextGraph("b", msgs)
    sig = Signals()
    lay = Layout(g, sig.counter, 1500, result_reserve=0.9, brief_revivals=True)
    first = lay.unit_of[2]
    assert first in lay.dropped_units
    cost, brief = lay.brief(first)
    assert brief is not None and brief.tool_calls == msgs[1].tool_calls
    n = sig.counter.count(msgs[1].content)
    assert brief.content == f"[text omitted ({n} tokens); stored in full, restore by message number #1]"
    # reviving costs the brief assistant message and the placeholder, not the full reasoning text
    full_cost = lay.units[first].cost
    assert cost == full_cost - sig.counter.count_message(msgs[1]) + sig.counter.count_message(brief)
    sel = lay.selection()
    assert sel.cost(2) == lay.delta[2] + cost
    sel.take(2)
    r = lay.assemble("t", sel)
    check_invariants(r, g, sig.counter)
    shown = dict(zip(r.positions, r.messages))
    assert shown[1].rendered_as == "brief" and shown[2] == msgs[2]
    assert r.history_tokens <= 1500 and "in brief" in r.reasons[1]


def test_an_altered_brief_view_breaks_the_verbatim_invariant():
    from historygraph.render import InvariantError
    msgs = long_steps(n=3)
    g = ContextGraph("b2", msgs)
    sig = Signals()
    lay = Layout(g, sig.counter, 900, result_reserve=0.9, brief_revivals=True)
    sel = lay.selection()
    sel.take(2)
    r = lay.assemble("t", sel)
    i = r.positions.index(1)
    r.messages[i] = r.messages[i].with_content(r.messages[i].content.replace("#1]", "#3]"), "brief")
    with pytest.raises(InvariantError, match="verbatim"):
        check_invariants(r, g, sig.counter)


def test_learned_with_brief_revivals_keeps_the_invariants_on_a_long_session():
    msgs = long_steps(n=12)
    g = ContextGraph("b3", msgs)
    sig = Signals()
    for budget in (900, 1500, 3000):
        r = create("learned", result_reserve=0.9, brief_revivals=True).render(g, budget, sig)
        check_invariants(r, g, sig.counter)
        assert r.history_tokens <= budget


def test_replay_table_reports_recall_as_a_share_of_the_oracle(tmp_path):
    from historygraph.eval.report import summarize
    tr = oracle_trace()
    # B = 1000 holds the newest result (shown whatever the selection: invariant §5.9) and one more
    res = replay_trace(tr, {n: create(n, replay=True) for n in ("oracle", "prune", "full")}, 1000, Signals())
    _, per_source = summarize([res])
    rows = {r["policy"]: r for r in per_source if r["source"] == "ALL"}
    assert rows["oracle"]["pct_of_oracle"] == 100.0 and rows["prune"]["pct_of_oracle"] == 0.0
    # full ignores B (its history reaches more than 1000 tokens): no share of the limit under B
    assert rows["full"]["max_history_tokens"] > 1000 and rows["full"].get("pct_of_oracle") is None


@pytest.mark.slow
def test_the_shipped_model_is_recreated_by_the_documented_fit(tmp_path, traces_dir):
    """docs/learned.md: `historygraph fit ../shared/traces-train/mini-swe-agent-deepseek` re-creates
    the shipped model (a blend of a logistic regression and LambdaRank trees); the file stores 5
    significant digits of weights and leaf values, compared here within 1e-4 relative; the trees'
    structure exactly."""
    from historygraph.policies.learned.model import BlendReuseModel
    train = traces_dir.parent / "traces-train" / "mini-swe-agent-deepseek"
    if not train.is_dir():
        pytest.skip(f"training traces not found at {train}")
    from historygraph.traces import read_traces
    traces = [t for f in sorted(train.glob("*")) for t in read_traces(f)]
    fresh = fit_traces(traces, tmp_path / "m.json", Signals().counter)
    shipped = ReuseModel.load()
    assert isinstance(fresh, BlendReuseModel) and isinstance(shipped, BlendReuseModel)
    assert shipped.meta["traces"] == fresh.meta["traces"] == 90 and fresh.weights == shipped.weights
    (lf, tf), (ls, ts) = fresh.models, shipped.models
    assert isinstance(lf, ReuseModel) and isinstance(ls, ReuseModel)
    assert np.allclose(lf.coef, ls.coef, rtol=1e-4, atol=1e-6)
    assert np.allclose(lf.mean, ls.mean, rtol=1e-4) and lf.intercept == pytest.approx(ls.intercept, rel=1e-4)
    assert isinstance(tf, TreeReuseModel) and isinstance(ts, TreeReuseModel)
    assert all(np.array_equal(getattr(tf, k), getattr(ts, k)) for k in ("roots", "feature", "left", "right"))
    assert np.allclose(tf.threshold, ts.threshold, rtol=1e-9)
    assert np.allclose(tf.value, ts.value, rtol=1e-4, atol=1e-9)
    assert np.allclose(tf.calibration, ts.calibration, rtol=1e-4)


def test_error_flag_is_the_error_pattern_searched_whole(traces_dir):
    """``has_error`` (the error pattern's alternatives searched one at a time, each where its
    literal occurs) is true exactly where ``_ERROR.search`` finds a match, on the real traces'
    results and on made-up texts at its edges."""
    from historygraph.policies.learned import result_facts as fx
    from historygraph.traces import read_traces

    texts = ["<returncode>0</returncode>", "<returncode>1</returncode>", "ValueError: x", "MyError_x", "xError",
             "Errors", "FAILED", "FAILEDx", "a FAILED b", "xerror: y", "error: y", "Traceback (most recent call last):",
             "éError", "Error\u0130", "error:", ""]
    for tr in read_traces(traces_dir):
        texts += [m.content[:fx.TEXT_CHARS] for m in tr.messages if m.role == "tool"]
    assert [fx.has_error(t) for t in texts] == [fx._ERROR.search(t) is not None for t in texts]
    assert fx.has_error("ValueError: x") and not fx.has_error("Errors") and not fx.has_error("xerror: y")


class _FixedModel:
    """Reuse probabilities by position (a test double for the fitted model)."""

    def __init__(self, prob: dict[int, float]) -> None:
        self.prob = prob

    def predict(self, X, keys=None, owner=None):
        return np.array([self.prob.get(int(p), 0.0) for p in keys])


def _talkative_history() -> list[Message]:
    """A task, four steps whose reasoning is ~300 tokens and whose results ~400, then a call whose
    small result is the newest (positions of the four results: 2, 4, 6, 8)."""
    msgs = [Message("user", "task")]
    for i in range(4):
        msgs += [Message("assistant", "plan " * 300, (bash(f"c{i}", f"cat f{i}.py"),)),
                 Message("tool", f"line{i} " + "word " * 400, tool_call_id=f"c{i}")]
    msgs += [Message("assistant", "", (bash("c9", "ls"),)), Message("tool", "a.py", tool_call_id="c9")]
    return msgs


@pytest.mark.parametrize("reserve_always", [True, False])
def test_reserve_always_drops_fitting_steps_when_their_room_shows_more_likely_results(reserve_always):
    """B = 2,400: every step fits with its result as a placeholder (about 1,500 tokens), leaving room
    for about two of the four 400-token results. Each has reuse probability 0.5: keeping the steps
    shows two (worth 1.0); dropping them to the reserve (5 % of B) and bringing back the steps of the
    results shown, in brief, shows all four (worth 2.0), so that layout is rendered. Off, the steps stay."""
    g = ContextGraph("r", _talkative_history())
    sig = Signals()
    pol = create("learned", reserve_always=reserve_always)
    pol.model = _FixedModel({2: 0.5, 4: 0.5, 6: 0.5, 8: 0.5})
    lay = Layout(g, sig.counter, 2400, result_reserve=0.95)
    assert not lay.fits_in_full and not lay.dropped_units  # the steps fit: the layout alone drops none
    r = pol.render(g, 2400, sig)
    check_invariants(r, g, sig.counter)
    shown = {2, 4, 6, 8} & set(r.full)
    if reserve_always:
        assert shown == {2, 4, 6, 8} and any(m.rendered_as == "brief" for m in r.messages)
    else:
        assert len(shown) == 2 and sum(m.content == "plan " * 300 for m in r.messages) == 4  # every step's reasoning kept


def test_reserve_always_keeps_the_steps_when_dropping_them_shows_nothing_more():
    """Only the first result is likely (0.5; the others below min_probability): both layouts show it
    alone, worth the same, and the steps stay."""
    g = ContextGraph("r", _talkative_history())
    sig = Signals()
    pol = create("learned")
    pol.model = _FixedModel({2: 0.5})
    r = pol.render(g, 2400, sig)
    check_invariants(r, g, sig.counter)
    assert {2, 4, 6, 8} & set(r.full) == {2} and sum(m.content == "plan " * 300 for m in r.messages) == 4
