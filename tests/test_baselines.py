"""The model-free baselines on small synthetic histories with hand-computed expectations."""

import pytest
import numpy as np

from historygraph.history.events import Message, ToolCall
from historygraph.history.graph import ContextGraph
from historygraph.policies import Signals, create
from historygraph.policies.recap.baselines import block_chars, char_budget
from historygraph.policies.baselines.windows import line_count
from historygraph.render import Layout, check_invariants


@pytest.fixture(scope="module")
def signals():
    return Signals()


def steps(bodies, assistant=lambda i: f"step {i}", args="{}"):
    """system (0), user (1), then step i = assistant at 2+2i with call c<i>, its result at 3+2i."""
    msgs = [Message("system", "s"), Message("user", "task")]
    for i, body in enumerate(bodies):
        msgs.append(Message("assistant", assistant(i), (ToolCall(f"c{i}", "bash", args),)))
        msgs.append(Message("tool", body, tool_call_id=f"c{i}"))
    return ContextGraph("g", msgs)


def result(i):
    return 3 + 2 * i


def just_over(g, signals):
    """A budget one token below the complete history, so the policy must act but rarely binds."""
    return Layout(g, signals.counter, None).full_history_tokens - 1


def test_sliding_window_keeps_the_six_newest_observations_in_full(signals):
    g = steps([f"output {i}\n" * 40 for i in range(10)])
    r = create("cw-sliding-window").render(g, just_over(g, signals), signals)
    check_invariants(r, g, signals.counter)
    assert r.full == [result(i) for i in range(4, 10)]
    older = r.messages[r.positions.index(result(3))]
    assert older.rendered_as == "placeholder" and "c3" in older.content


def test_masking_placeholder_states_the_omitted_line_count(signals):
    g = steps(["\n".join(f"row {j}" for j in range(10 + i)) for i in range(8)])  # result i has 10 + i lines
    r = create("observation-masking").render(g, just_over(g, signals), signals)
    check_invariants(r, g, signals.counter)
    assert r.full == [result(i) for i in range(3, 8)]  # n = 5
    masked = r.messages[r.positions.index(result(2))]
    assert "12 lines" in masked.content and "c2" in masked.content and masked.rendered_as == "placeholder"


def test_line_count_counts_lines_as_an_editor_does():
    assert (line_count(""), line_count("a"), line_count("a\nb\n"), line_count("a\n\nb")) == (0, 1, 2, 3)


def test_window_results_that_do_not_fit_become_placeholders(signals):
    g = steps(["big " * 400, "small", "small", "small"])
    r = create("cw-sliding-window").render(g, 300, signals)
    assert r.history_tokens <= 300 and result(0) not in r.full and result(3) in r.full


def test_bm25_retrieves_the_older_observation_that_matches_the_current_step(signals):
    # bodies longer than their placeholders, so no step has to be dropped (a revived step would
    # also pay for splitting the dropped-step marker)
    bodies = [" ".join([b] * 8) for b in ["apples and pears", "DATABASES settings: ENGINE sqlite3 NAME db.sqlite3",
                                            "bananas are yellow", "the weather is sunny", "cats sleep a lot",
                                            "dogs bark", "fish swim", "ok"]]
    g = steps(bodies, assistant=lambda i: "now check the DATABASES settings ENGINE" if i == 7 else f"step {i}")
    r = create("cw-bm25").render(g, just_over(g, signals), signals)
    check_invariants(r, g, signals.counter)
    # 3 most recent (5, 6, 7) plus the only older observation sharing terms with the step (1)
    assert r.full == [result(1), result(5), result(6), result(7)]


def test_semantic_retrieval_adds_the_most_similar_older_result_after_recent_turns(signals):
    filler = ["Invoice 4471 was paid by bank transfer on Monday.", "The garden hose is green and ten metres long.",
              "The capital of France is Paris, on the river Seine.", "Quarterly sales rose four percent in Ohio.",
              "Install the shelf with four wall screws."]
    bodies = [" ".join([f] * 6) for f in filler] + [f"recent output {i} " * 30 for i in range(3)]  # all longer than a placeholder
    g = steps(bodies, assistant=lambda i: "Which city is the capital of France?" if i == 7 else f"step {i}")
    lay = Layout(g, signals.counter, None)
    budget = lay.base_tokens + sum(lay.delta[result(i)] for i in (5, 6, 7)) + lay.delta[result(2)] + 2
    r = create("semantic").render(g, budget, signals)
    check_invariants(r, g, signals.counter)
    assert r.full == [result(2), result(5), result(6), result(7)]


def test_semantic_recent_results_are_capped_at_sixty_percent_of_b(signals):
    g = steps(["x " * 300, "y " * 300, "z " * 300])  # three recent results of ~300 tokens
    lay = Layout(g, signals.counter, None)
    budget = lay.full_history_tokens - 1
    r = create("semantic").render(g, budget, signals)
    # newest first: the 2nd and 3rd fit in 0.6·B together, all three would not
    assert sum(lay.delta[p] for p in (result(1), result(2))) <= 0.6 * budget < sum(lay.delta[p] for p in lay.delta)
    assert r.full == [result(1), result(2)]


def test_char_budget_is_the_floor_of_beta_times_cost():
    assert char_budget(0.1, 12345) == 1234 and char_budget(0.1, 9) == 0 and char_budget(1.0, 7) == 7


def test_block_chars_count_content_and_serialized_calls():
    g = ContextGraph("g", [Message("user", "task"), Message("assistant", "abc", (ToolCall("c0", "bash", "{}"),)),
                           Message("tool", "hello", tool_call_id="c0")])
    assert block_chars(g, [1, 2]) == 3 + len("bash") + len("{}") + 5


def recap_graph():
    # blocks: 10 steps of 6 + 100 characters ("bash" + "{}" + the result); step 9 is the protected current turn
    return steps(["x" * 100] * 10, assistant=lambda i: "")


def test_recap_recency_keeps_the_newest_blocks_within_the_character_budget(signals):
    g = recap_graph()
    # the only user message is the current one (outside V): c(V) = 10·106 = 1060, C = floor(0.5·1060) = 530;
    # the protected current turn (106) leaves 424 characters = exactly 4 more blocks
    r = create("recap-recency", beta=0.5).render(g, just_over(g, signals), signals)
    check_invariants(r, g, signals.counter)
    assert r.full == [result(i) for i in (5, 6, 7, 8, 9)]
    assert r.dropped == [p for i in range(5) for p in (2 + 2 * i, result(i))]
    # left out by the policy's own rule, not by the shared non-tool share: the reason says so
    assert r.reasons[result(0)].startswith("left out") and r.reasons[2].startswith("left out")
    r = create("recap-recency", beta=0.499).render(g, just_over(g, signals), signals)  # C = 528: 3 blocks
    assert r.full == [result(i) for i in (6, 7, 8, 9)]


def test_recap_random_is_seeded_keeps_original_order_and_differs_by_seed(signals):
    g = recap_graph()
    B = just_over(g, signals)
    a = create("recap-random", beta=0.5).render(g, B, signals)
    b = create("recap-random", beta=0.5).render(g, B, signals)
    c = create("recap-random", beta=0.5, seed=7).render(g, B, signals)
    check_invariants(a, g, signals.counter)
    assert a.messages == b.messages and a.full == b.full
    assert len(a.full) == 5 and result(9) in a.full  # 4 sampled blocks + the current turn
    real = [p for p in a.positions if p is not None]
    assert real == sorted(real)
    assert a.full != c.full


def test_recap_random_visits_are_the_draws_of_random_sample():
    """The lazy order is ``random.Random(seed).sample(blocks, len(blocks))`` for any size (the
    selection stops drawing once nothing left can fit; its kept blocks must be the same)."""
    import random

    from historygraph.policies.recap.baselines import RecapRandom

    pol = RecapRandom()
    for n in (0, 1, 2, 5, 6, 31, 32, 33, 1000, 4097):
        g = ContextGraph(f"s{n}")
        blocks = [3 * i + 1 for i in range(n)]
        want = random.Random(f"0:s{n}:0").sample(blocks, n)
        assert list(pol.visits(g, blocks)) == want == pol.order(g, blocks)


def test_recap_random_reasons_after_it_stops_drawing(signals):
    # C = 530, the protected turn 106: four blocks of 106 fill C exactly, so no fifth can fit and
    # the draws stop; every other block is still reported as not fitting, as when all were visited
    g = recap_graph()
    r = create("recap-random", beta=0.5).render(g, just_over(g, signals), signals)
    kept = [i for i in range(9) if result(i) in r.full]
    assert len(kept) == 4
    for i in range(9):
        want = "kept: 106 chars;" if i in kept else "left out: 106 chars do not fit in C = 530 chars (or B)"
        assert r.reasons[result(i)].startswith(want) and r.reasons[2 + 2 * i].startswith(want)
    used = sorted(int(r.reasons[result(i)].split("; ")[1].split(" of")[0]) for i in kept)
    assert used == [212, 318, 424, 530]


def test_recap_baselines_also_respect_the_token_budget(signals):
    g = recap_graph()
    for name in ("recap-recency", "recap-random"):
        r = create(name, beta=1.0).render(g, 200, signals)  # every block fits C, only B binds
        check_invariants(r, g, signals.counter)
        assert r.history_tokens <= 200 and 1 <= len(r.full) < 10


def test_policies_command_lists_every_baseline_with_parameters_and_sources():
    import json

    from typer.testing import CliRunner

    from historygraph.cli import app

    res = CliRunner().invoke(app, ["policies", "--json"])
    assert res.exit_code == 0
    rows = {r["name"]: r for r in json.loads(res.output)}
    assert rows["recap-random"]["parameters"] == {"beta": 0.1, "seed": 0}
    assert rows["cw-sliding-window"]["parameters"] == {"n": 6} and rows["observation-masking"]["parameters"] == {"n": 5}
    assert rows["cw-bm25"]["parameters"] == {"n_full": 6, "n_retrieved": 3}
    assert rows["semantic"]["parameters"]["recent_share"] == 0.6
    assert (rows["cw-hybrid"]["parameters"]["trigger_turns"], rows["cw-hybrid"]["parameters"]["summarize_turns"]) == (53, 43)
    assert rows["cw-llm-summary"]["parameters"]["max_observations"] == 10
    assert "B.2" in rows["compact-llm"]["source"] and "B.2" in rows["recency-summary"]["source"]
    assert "ReCAP" in rows["recap-recency"]["source"] and "SWE-agent" in rows["observation-masking"]["source"]


@pytest.mark.parametrize("n", [1, 5, 259, 260, 513, 1201, 2001, 2503, 5001, 5003])
def test_semantic_product_has_the_bits_of_the_single_thread_blas_product(n):
    """The semantic baseline's ``rows @ q`` (``single_thread_product``) equals, bit for bit, the
    product numpy's BLAS computes when limited to one thread (threadpoolctl, an independent way to
    get it), at sizes below and above OpenBLAS's threading threshold (1,200 rows at 384)."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from historygraph.policies.baselines.retrieval import single_thread_product

    rng = np.random.default_rng(n)
    rows = rng.standard_normal((n, 384)).astype(np.float32)
    q = rng.standard_normal(384).astype(np.float32)
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
        want = rows @ q
    assert single_thread_product(rows, q).tobytes() == want.tobytes()
