"""The small-model prompt compressors (LLMLingua, LongLLMLingua, Selective Context): the algorithms
on hand-computed values, and the policies' budget, caching, cost and invariants."""

import math

import numpy as np
import pytest

from historygraph.history.events import Message, ToolCall
from historygraph.history.graph import ContextGraph
from historygraph.policies import Signals, create, get_spec
from historygraph.policies.baselines.compression import (budget_controller, contrastive, iterative_compress, join_kept, lexical_units,
                                               percentile_keep, rank_ratios, select_top, snap, unit_information)
from historygraph.policies.baselines.lingua import question_of, selective_text
from historygraph.render import InvariantError, check_invariants
from historygraph.store.memory import MemoryStore

from doubles import TableScorer

LINGUA = ["llmlingua-smollm", "longllmlingua-smollm", "selective-context-smollm"]
LN2 = math.log(2)


# -- the algorithms, by hand ------------------------------------------------------------------

def test_budget_controller_ratios_on_a_hand_made_instance():
    # τ = 200 / 800 = 0.25; k·τ·L = 2 · 0.25 · 800 = 400 tokens; descending perplexity: 1, 2, 0, 3;
    # 200 + 100 + 100 = 400 fits, + 400 does not; token ratio = 200 / 400
    chosen, tau, tau_tok = budget_controller([3.0, 9.0, 5.0, 1.0], [100, 200, 100, 400], room=200, k=2)
    assert chosen == [1, 2, 0] and tau == 0.25 and tau_tok == 0.5
    # k = 1: only 200 tokens may be taken: component 1 alone, whose ratio is then 1
    assert budget_controller([3.0, 9.0, 5.0, 1.0], [100, 200, 100, 400], room=200, k=1) == ([1], 0.25, 1.0)
    # the top component is taken even when it alone exceeds k·τ·L
    assert budget_controller([1.0, 2.0], [50, 1000], room=100, k=1)[0] == [1]
    with pytest.raises(ValueError, match="k must be"):
        budget_controller([1.0], [1], 1, 0.5)


def test_token_selection_by_a_hand_given_perplexity_table():
    nll = np.array([2.0, 0.5, 3.0, 0.5, 1.0])
    assert select_top(nll, 0.4).tolist() == [True, False, True, False, False]   # ⌈2.0⌉ = 2 tokens: 3.0, 2.0
    assert select_top(nll, 0.5).tolist() == [True, False, True, False, True]    # ⌈2.5⌉ = 3 tokens
    assert select_top(np.array([1.0, 1.0, 1.0]), 0.3).tolist() == [True, False, False]  # a tie: the earlier one
    assert select_top(np.array([4.0]), 0.01).tolist() == [True]                 # never all of a text dropped


def test_kept_tokens_with_overlapping_spans_emit_each_character_once():
    # a byte-level tokenizer splits "é" into two tokens that both carry its span (1, 2)
    text = "aé b"
    spans = [(0, 1), (1, 2), (1, 2), (2, 4)]
    assert join_kept(text, spans, [True, True, True, True]) == text
    assert join_kept(text, spans, [False, False, True, True]) == "é b"
    # iterative segments that meet inside the character do not repeat it either
    score = lambda seg, ctx: ([(0, len(seg))], np.array([1.0]))
    assert iterative_compress(text, spans, 1.0, 2, score) == "aé b"


def test_iterative_compression_conditions_each_segment_on_the_compressed_prefix():
    # segments "x y z" and " x w v", one token kept of three in each. In the second, "x" occurs in
    # the compressed prefix "x", so the double scores it 5 − 2 = 3 < w = 4: "w" is kept, not "x"
    scorer = TableScorer({"x": 5, "y": 1, "z": 2, "w": 4, "v": 3}, context_bonus=2)
    text = "x y z x w v"
    score = lambda seg, ctx: (lambda s: (s.spans, s.nll))(scorer.score(seg, ctx))
    assert iterative_compress(text, scorer.tokenize(text), 1 / 3, 3, score) == "x w"
    assert [c[1] for c in scorer.calls] == ["", "x"]
    # one segment (no iteration): the three highest of x y z x w v are x, x, w
    assert iterative_compress(text, scorer.tokenize(text), 0.5, 6, score) == "x x w"


def test_selective_context_drops_units_on_a_hand_computed_self_information_table():
    # sentence units "a b." | " c d e." | " f."; token NLL = bits · ln 2, so the units hold 2, 3 and
    # 4 bits. Keep 2/3: the 33.3rd percentile of (2, 3, 4) is 2.667, so the first sentence goes
    text = "a b. c d e. f."
    scorer = TableScorer({"a": LN2, "b.": LN2, "c": LN2, "d": LN2, "e.": LN2, "f.": 4 * LN2})
    s = scorer.score(text)
    units = lexical_units(text, "sentence")
    assert [text[a:b] for a, b in units] == ["a b.", " c d e.", " f."]
    info = unit_information(s.spans, s.nll, units)
    assert np.allclose(info, [2, 3, 4])
    assert percentile_keep(info, 2 / 3).tolist() == [False, True, True]
    assert selective_text(text, s.spans, s.nll, 2 / 3, "sentence") == " c d e. f."
    # phrase units are words of 1, 1, 1, 1, 1 and 4 bits: keeping 1/6, the 83.3rd percentile is
    # 1 + (4 − 1)·(5·5/6 − 4) = 1.5, so only "f." stays; keeping 0.2, it is 1 and ties keep all
    assert selective_text(text, s.spans, s.nll, 1 / 6, "phrase") == " f."
    assert selective_text(text, s.spans, s.nll, 1 / 6, "token") == " f."
    assert selective_text(text, s.spans, s.nll, 0.2, "phrase") == text


def test_lexical_units_cover_the_text_and_reject_unknown_units():
    text = "see foo.py: ok\nline two. And more"
    assert "".join(text[a:b] for a, b in lexical_units(text, "sentence")) == text  # file names do not split
    assert [text[a:b] for a, b in lexical_units(text, "phrase")][:3] == ["see", " foo.py:", " ok"]
    with pytest.raises(ValueError, match="unit"):
        lexical_units(text, "clause")


def test_rank_ratios_contrastive_scores_and_the_ladder():
    assert np.allclose(rank_ratios(0.3, 3, 0.2, 0.05), [0.4, 0.3, 0.2])
    assert np.allclose(rank_ratios(0.1, 2, 0.4, 0.05), [0.3, 0.05])         # clipped at the lowest ratio
    assert rank_ratios(0.5, 1, 0.3, 0.05) == [0.5]
    assert contrastive(np.array([3.0, 1.0]), np.array([1.0, 1.5])).tolist() == [2.0, -0.5]
    ladder = (0.8, 0.5, 0.33, 0.2, 0.1, 0.05)
    assert [snap(x, ladder) for x in (1.2, 0.9, 0.5, 0.49, 0.01)] == [1.0, 0.8, 0.5, 0.33, 0.05]


# -- the policies -------------------------------------------------------------------------------

def _graph(n=8, words=260):
    vocab = "alpha beta gamma delta error file.py line 42 ok fail Traceback import os sys value".split()
    msgs = [Message("system", "s"), Message("user", "fix the error in file.py")]
    for i in range(n):
        msgs.append(Message("assistant", f"step {i}", (ToolCall(f"c{i}", "bash", '{"command": "cat f"}'),)))
        body = " ".join(vocab[(i * 7 + j * j) % len(vocab)] for j in range(words + 40 * i))
        msgs.append(Message("tool", body, tool_call_id=f"c{i}"))
    msgs.append(Message("assistant", "", (ToolCall("last", "bash", "{}"),)))
    return ContextGraph("g", msgs)


@pytest.mark.parametrize("name", LINGUA)
def test_policy_compresses_results_to_fit_and_keeps_the_invariants(name):
    g = _graph()
    scorer = TableScorer(seconds=0.5)
    sig = Signals(scorer_factory=lambda: scorer)
    r = create(name).render(g, 1500, sig)
    check_invariants(r, g, sig.counter)
    assert r.history_tokens <= 1500
    compressed = [m for m in r.messages if m.rendered_as == "compressed"]
    assert compressed and r.stats["compressed"] == len(compressed)
    for m in compressed:
        assert m.content.startswith(f"[tool result {m.tool_call_id} compressed by ")
    # compressed results never count as complete (ContextRender B.4)
    assert not set(r.full) & {p for p, m in zip(r.positions, r.messages) if m.rendered_as == "compressed"}
    # every forward pass is charged: calls, tokens read, seconds
    assert r.stats["model_calls"] == len(scorer.calls) > 0
    assert r.stats["model_seconds"] == pytest.approx(0.5 * len(scorer.calls))
    assert r.stats["model_output_tokens"] == 0 and r.stats["model_input_tokens"] > 0


@pytest.mark.parametrize("name", LINGUA)
def test_compressing_the_same_result_twice_makes_no_model_call(name):
    g = _graph()
    scorer = TableScorer()
    store = MemoryStore()
    sig = Signals(scorer_factory=lambda: scorer, store=store)
    first = create(name).render(g, 1500, sig)
    calls = len(scorer.calls)
    again = create(name).render(g, 1500, sig)  # a new instance: the store's content-hash cache answers
    assert len(scorer.calls) == calls and again.stats["model_calls"] == 0
    assert again.messages == first.messages


def test_the_per_render_cap_bounds_the_results_that_need_the_model():
    g = _graph()
    scorer = TableScorer()
    sig = Signals(scorer_factory=lambda: scorer)
    r = create("selective-context-smollm", max_new_per_render=2).render(g, 1500, sig)
    assert len({text for text, _ in scorer.calls}) == 2 and r.stats["compressed"] == 2
    capped = [p for p, why in r.reasons.items() if "per-render cap" in why]
    assert len(capped) == 6
    check_invariants(r, g, sig.counter)


def test_longllmlingua_conditions_on_the_latest_user_message():
    g = _graph()
    assert question_of(g) == "fix the error in file.py"
    scorer = TableScorer()
    create("longllmlingua-smollm").render(g, 1500, Signals(scorer_factory=lambda: scorer))
    assert {ctx for _, ctx in scorer.calls} == {"", "fix the error in file.py\n"}
    only_calls = ContextGraph("h", [Message("assistant", "look", (ToolCall("a", "grep", '{"q": 1}'),))])
    assert question_of(only_calls) == 'look\ngrep({"q": 1})'


def test_checker_rejects_a_compressed_result_that_adds_text_or_loses_its_id():
    g = _graph(n=2, words=30)
    sig = Signals(scorer_factory=TableScorer)
    r = create("prune").render(g, 100_000, sig)
    i = next(i for i, m in enumerate(r.messages) if m.role == "tool")
    orig = r.messages[i]
    head = f"[tool result {orig.tool_call_id} compressed by X with Y: 2 of 30 tokens kept; the full result is stored]\n"
    for body, ok in [(orig.content[:5] + orig.content[-5:], True), ("INJECTED", False)]:
        r.messages[i] = orig.with_content(head + body, "compressed")
        r.history_tokens = sum(sig.counter.count_message(m) for m, p in zip(r.messages, r.positions) if p not in (0, 1))
        r.budget = None
        if ok:
            check_invariants(r, g, sig.counter)
        else:
            with pytest.raises(InvariantError, match="compressed"):
                check_invariants(r, g, sig.counter)
    r.messages[i] = orig.with_content(head.replace(orig.tool_call_id, "other") + orig.content[:5], "compressed")
    r.history_tokens = sum(sig.counter.count_message(m) for m, p in zip(r.messages, r.positions) if p not in (0, 1))
    with pytest.raises(InvariantError, match="compressed"):
        check_invariants(r, g, sig.counter)


def test_registry_says_the_compressor_differs_from_the_papers():
    for name in LINGUA:
        assert "SmolLM2-135M" in get_spec(name).source and "instead of" in get_spec(name).source
    assert "LLMLingua-2" in get_spec("llmlingua-smollm").source and "cannot run here" in get_spec("llmlingua-smollm").source


@pytest.mark.lm
def test_smollm2_scorer_and_a_policy_with_the_real_model():
    from historygraph.signals.perplexity import SmolLM2Scorer

    scorer = SmolLM2Scorer()
    text = "def add(a, b):\n    return a + b\n"
    s = scorer.score(text)
    assert [text[a:b] for a, b in s.spans] and "".join(text[a:b] for a, b in s.spans) == text
    assert len(s.nll) == len(s.spans) and np.isfinite(s.nll).all() and (s.nll >= 0).all()
    # a repeated line is much less surprising the second time
    twice = scorer.score(text + text)
    n = len(s.spans)
    assert twice.nll[n + 2:].mean() < twice.nll[2:n].mean()
    g = _graph(n=4, words=120)
    sig = Signals(scorer_factory=lambda: scorer)
    for name in LINGUA:
        r = create(name).render(g, 700, sig)
        check_invariants(r, g, sig.counter)
        assert r.stats["model_calls"] > 0 or r.stats["compressed"] == 0
