"""The recommended policy per budget and price model (historygraph.eval.recommend), on summary rows
whose figures are set by hand so that the choice is known without the code."""

import pytest

from historygraph.eval.recommend import Pick, explanation, one_line, recommend, table_rows


def _row(budget, policy, recall, a, b, source="ALL"):
    return {"source": source, "budget": budget, "policy": policy, "recall": recall, "cost_cache_a": a, "cost_cache_contextrender": b}


ROWS = [
    # B = 6000: with model a, learned (80 %) and prune (79 %) cost less than Full; learned has more recall,
    # prune is within 2 points and cheaper. With contextrender prices only prune and contextrender are
    # cheaper than Full; contextrender (85 %) wins and no cheaper one is within 2 points of it.
    _row(6000, "learned", 80.0, 0.7, 1.2), _row(6000, "prune", 79.0, 0.5, 0.9),
    _row(6000, "contextrender", 85.0, 1.1, 0.95), _row(6000, "full", 100.0, 1.0, 1.0),
    _row(6000, "oracle", 95.0, 0.4, 0.4),  # cheapest and best, but it reads the future
    _row(6000, "prune", 10.0, 0.1, 0.1, source="swe-agent"),  # one source's row: not the summary over all
    # B = 3000: nothing costs less than Full with either cache
    _row(3000, "learned", 70.0, 1.3, 1.01), _row(3000, "full", 100.0, 1.0, 1.0),
    # B = 12000: no trace's Full history exceeds B, so no cost at all
    _row(12000, "learned", 100.0, None, None), _row(12000, "full", 100.0, None, None),
]


def test_the_choice_is_the_best_recall_among_policies_cheaper_than_full_and_the_thrifty_pick_is_within_two_points():
    recs = {(r.budget, r.price_model): r for r in recommend(ROWS, ["a", "contextrender"])}
    assert [k for k in recs] == [(3000, "a"), (3000, "contextrender"), (6000, "a"), (6000, "contextrender"),
                                 (12000, "a"), (12000, "contextrender")]
    assert recs[(6000, "a")].choice == Pick("learned", 80.0, 0.7) and recs[(6000, "a")].thrifty == Pick("prune", 79.0, 0.5)
    assert recs[(6000, "contextrender")].choice == Pick("contextrender", 85.0, 0.95) and recs[(6000, "contextrender")].thrifty is None
    assert recs[(3000, "a")].choice == Pick("full", 100.0, 1.0) and recs[(3000, "a")].none_cheaper
    assert recs[(12000, "a")].choice is None and not recs[(12000, "a")].none_cheaper
    # with a tolerance of 0 points prune (1 point below learned) is no longer named
    assert recommend(ROWS, ["a"], tolerance=0.0)[1].thrifty is None
    with pytest.raises(ValueError, match="tolerance -1"):
        recommend(ROWS, ["a"], tolerance=-1)


def test_equal_recall_goes_to_the_cheaper_policy_and_a_missing_full_still_stands_as_the_reference():
    rows = [_row(6000, "x", 50.0, 0.8, 0.8), _row(6000, "y", 50.0, 0.6, 1.5)]
    recs = recommend(rows, ["a", "contextrender"])
    assert recs[0].choice == Pick("y", 50.0, 0.6)
    assert recs[1].choice == Pick("x", 50.0, 0.8)
    only_dearer = recommend([_row(6000, "x", 50.0, 1.2, 1.2)], ["a"])[0]
    assert only_dearer.choice == Pick("full", 100.0, 1.0) and only_dearer.none_cheaper


def test_the_console_line_and_the_report_table_say_the_same():
    recs = recommend(ROWS, ["a", "contextrender"])
    assert one_line([r for r in recs if r.budget == 6000]) == (
        "B = 6000: learned (recall 80.0 %) for a; contextrender (recall 85.0 %) for CR-eq3; "
        "cheapest within 2 points: prune (recall 79.0 %) for a")
    assert one_line([r for r in recs if r.budget == 3000]) == (
        "B = 3000: full (recall 100.0 %) for every price model (no policy is cheaper than Full history with the cache)")
    assert one_line([r for r in recs if r.budget == 12000]).startswith("B = 12000: no trace's Full history exceeds B")
    # B = 2000: Full history exceeds B, but every policy had budget errors there, so none is priced: say that
    errors = [{**_row(2000, "learned", 60.0, None, None), "budget_errors": 1}, {**_row(2000, "full", 100.0, None, None),
                                                                               "budget_errors": 0}]
    line = one_line(recommend(errors, ["a"]))
    assert line.startswith("B = 2000: no policy is priced: on every trace whose Full history exceeds B, each policy had "
                           "calls whose protected history B could not hold") and line.endswith("raise B")
    assert table_rows(recommend(errors, ["a"]))[1][0][2] == "– (no policy is priced: on every trace whose Full history exceeds B, each policy had calls whose protected history B could not hold (budget errors, which leave a trace out of the cost))"
    head, rows = table_rows(recs)
    assert head[:3] == ["B", "price model", "recommended"]
    assert rows[2] == ["6000", "a", "learned", "80.0", "0.700", "prune", "79.0", "0.500"]
    assert rows[0][2] == "full (none cheaper)"
    assert "highest Later-Used Result Recall" in explanation() and "2 percentage points" in explanation()


def test_with_several_sources_each_gets_its_own_recommendation_not_the_pooled_one():
    """Pooled, a coding agent's few long traces vanish among short ones: the ALL rows say learned keeps
    94.3 %, but on the source whose histories exceed B it keeps 65 % and prune, cheaper, 70 %."""
    rows = [_row(6000, "learned", 94.3, 0.8, 0.8), _row(6000, "prune", 93.0, 0.7, 0.7),  # pooled
            _row(6000, "learned", 65.0, 0.8, 0.8, source="codex"), _row(6000, "prune", 70.0, 0.7, 0.7, source="codex"),
            _row(6000, "learned", 99.0, 0.9, 0.9, source="appworld"), _row(6000, "prune", 96.0, 0.95, 0.95, source="appworld")]
    recs = recommend(rows, ["a"])
    assert [(r.source, r.choice) for r in recs] == [("appworld", Pick("learned", 99.0, 0.9)), ("codex", Pick("prune", 70.0, 0.7))]
    assert one_line([recs[1]]) == "B = 6000, codex: prune (recall 70.0 %) for a"
    head, table = table_rows(recs)
    assert head[:3] == ["B", "source", "price model"] and table[1][:5] == ["6000", "codex", "a", "prune", "70.0"]
