"""ContextWeaver: steps, parent scoring, ancestry, weaving, budget drops, ablations, the F.2 analyzer."""

import dataclasses
import json
import math

import pytest
from doubles import ScriptedModel

from historygraph.history.events import Message, ToolCall
from historygraph.history.graph import ContextGraph
from historygraph.policies import Signals, create
from historygraph.policies.contextweaver.policy import clean_summary
from historygraph.policies.contextweaver.analyzer import build_prompt, llm_selector, parse_parent_ids
from historygraph.render import check_invariants
from historygraph.signals.steps.features import Step, action_text, files_in, identifiers_in
from historygraph.signals.steps.parents import ParentScoring, lowcost_selector, score_parent
from historygraph.signals.steps.view import ancestry, build_steps
from historygraph.store.memory import MemoryStore

FILLER = " ".join(["lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor"] * 25)


def bash(cid, command):
    return ToolCall(cid, "bash", json.dumps({"command": command}))


def trajectory(steps):
    """``steps``: (thought, command, observation) triples -> graph with a task and one call per step."""
    g = ContextGraph("cw-test", [Message("system", "sys"), Message("user", "Fix the cli bug.")])
    for k, (thought, command, obs) in enumerate(steps):
        g.append(Message("assistant", thought, (bash(f"c{k}", command),)))
        g.append(Message("tool", obs, tool_call_id=f"c{k}"))
    return g


def woven_graph():
    """8 steps: 7 builds on 2 (cli.py, raw_text), 2 builds on 0 (parse_line); 1, 3, 4 share nothing."""
    def obs(text, k):
        return f"{text}\n{FILLER}\nend of output {k}"
    return trajectory([
        ("Read the parser.", "cat src/app/parse.py", obs("def parse_line(text):\n    return text.split()", 0)),
        ("List the docs.", "ls docs", obs("guide.md", 1)),
        ("Find callers.", "grep -n parse_line src/app/cli.py", obs("cli.py:12: value = parse_line(raw_text)", 2)),
        ("Say hello.", "echo hello", obs("hello", 3)),
        ("Check date.", "date", obs("monday", 4)),
        ("Check load.", "uptime", obs("up two days", 5)),
        ("Who am i.", "whoami", obs("root", 6)),
        ("Pass raw_text through.", "sed -i s/a/b/ src/app/cli.py", obs("done", 7)),
    ])


def result_pos(g, k):
    return g.result_of[f"c{k}"]


@pytest.fixture
def signals():
    return Signals(model_factory=ScriptedModel, store=MemoryStore())


def test_files_and_identifiers_are_extracted_from_text():
    text = ('cat /testbed/src/app/parse.py ./docs/guide.md && see https://docs.pytest.org/en/x.html\n'
            'File "src/app/cli.py", line 3, in parse_line\nLintResult raised; self.__init__ ok; value.pyc')
    assert files_in(text) == {"parse.py", "guide.md", "cli.py"}
    assert identifiers_in(text) == {"parse_line", "LintResult"}
    assert identifiers_in("getValue x_y ab_c HTTPError __init__ plain") == {"getValue", "ab_c", "HTTPError"}
    g = trajectory([("t", "cat a.py", "x")])
    assert action_text(g, 2) == "bash: cat a.py"


def _step(k, files=(), ids=(), parents=(), results=(1,)):
    return Step(k, 2 * k, tuple(results), "", "", frozenset(files), frozenset(ids), None, parents=tuple(parents))


def test_parent_scores_on_a_tiny_chain():
    cfg = ParentScoring()
    cur = _step(3, {"parse.py", "cli.py"}, {"parse_line", "raw_text"})
    s0 = _step(0, {"parse.py"}, {"parse_line"})
    s1 = _step(1, {"guide.md"}, ())
    s2 = _step(2, {"cli.py", "parse.py"}, {"parse_line", "raw_text"})
    # w_files·min(f,3) + w_ids·ln(1+i) + w_rec·0.8^(k−1−i)
    assert score_parent(s0, cur, cfg) == pytest.approx(1 + 0.5 * math.log(2) + 0.8 ** 2)
    assert score_parent(s1, cur, cfg) is None
    assert score_parent(s2, cur, cfg) == pytest.approx(2 + 0.5 * math.log(3) + 1)
    steps = [s0, s1, s2, cur]
    assert lowcost_selector(cfg)(steps, 3, [0, 1, 2]) == (2, 0)
    assert lowcost_selector(ParentScoring(max_parents=1))(steps, 3, [0, 1, 2]) == (2,)
    # the same picks from the postings of cur's files and identifiers (parse.py: s0, s2; cli.py: s2;
    # parse_line: s0, s2; raw_text: s2); a later step in a posting is not a candidate
    files, ids = [[0, 2], [2]], [[0, 2, 3], [2]]
    assert lowcost_selector(cfg).from_postings(steps, 3, files, ids) == (2, 0)
    assert lowcost_selector(ParentScoring(max_parents=1)).from_postings(steps, 3, files, ids) == (2,)
    # a failed step is not chosen, and the next best takes its place; no shared file or identifier: none
    failed = [s0, s1, _step(2, {"cli.py", "parse.py"}, {"parse_line", "raw_text"}), cur]
    failed[2].validation_status = "failed"
    assert lowcost_selector(cfg).from_postings(failed, 3, files, ids) == (0,)
    assert lowcost_selector(cfg).from_postings(steps, 3, [[]], []) == ()
    # equal scores: the more recent first (s0 and s1 share one file each with cur, 2 steps apart from it
    # and 1: s1 scores 1 + 0.8, s0 1 + 0.64; with the recency weight 0 they tie, and s1 comes first)
    flat = ParentScoring(w_recency=0.0)
    assert lowcost_selector(flat).from_postings(steps, 3, [[0], [1]], []) == (1, 0)
    # max_parents 0 or below cuts the ranking as the per-step selector does
    for cut in (0, -1):
        cfg_cut = ParentScoring(max_parents=cut)
        assert lowcost_selector(cfg_cut).from_postings(steps, 3, files, ids) == lowcost_selector(cfg_cut)(steps, 3, [0, 1, 2])
    assert lowcost_selector(ParentScoring(max_parents=-1)).from_postings(steps, 3, files, ids) == (2,)


def test_steps_from_a_graph_get_parents_from_shared_files_and_identifiers():
    g = woven_graph()
    steps = build_steps(g, lowcost_selector(ParentScoring()), "t")
    assert len(steps) == 8 and steps[2].results == (result_pos(g, 2),)
    assert steps[0].files == {"parse.py"} and steps[0].identifiers == {"parse_line"}
    assert [s.parents for s in steps] == [(), (), (0,), (), (), (), (), (2,)]
    assert all(s.validation_status == "unknown" for s in steps)


def test_bfs_stops_at_w_counted_ancestors():
    parents = {6: (5, 2), 5: (4,), 4: (3,), 2: (1,), 1: (0,)}
    steps = [_step(k, parents=parents.get(k, ())) for k in range(7)]
    assert ancestry(steps, 6, 2) == [5, 2]
    assert ancestry(steps, 6, 3) == [5, 2, 4]
    assert ancestry(steps, 6, 3, uncounted={5}) == [5, 2, 4, 1]
    assert ancestry(steps, 6, 10) == [5, 2, 4, 1, 3, 0]
    assert ancestry(steps, 6, 0) == []
    steps[2] = _step(2, parents=(1,), results=())  # no observation: traversed, not counted
    assert ancestry(steps, 6, 2) == [5, 2, 4]


PYTEST_FAIL = "tests/test_cli.py::test_raw PASSED\ntests/test_cli.py::test_split FAILED\n=== 1 failed, 1 passed in 0.1s ==="
PYTEST_PASS = "tests/test_cli.py::test_raw PASSED\ntests/test_cli.py::test_split PASSED\n=== 2 passed in 0.1s ==="


def test_validation_superseding_and_parent_eligibility():
    g = trajectory([
        ("Run tests.", "pytest tests/test_cli.py", PYTEST_FAIL),
        ("Look at cli.", "cat src/app/cli.py", "def test_split_helper(): pass  # cli.py"),
        ("Retest.", "pytest tests/test_cli.py", PYTEST_FAIL),
        ("Fix.", "sed -i s/a/b/ src/app/cli.py", "ok"),
        ("Retest.", "pytest tests/test_cli.py", PYTEST_PASS),
        ("Look again at test_cli.py.", "cat tests/test_cli.py", "def test_split(): ..."),
    ])
    steps = build_steps(g, lowcost_selector(ParentScoring()), "t")
    assert [s.validation_status for s in steps] == ["superseded", "unknown", "superseded", "unknown", "passed", "unknown"]
    assert steps[0].superseded_by == 4 and steps[2].superseded_by == 4
    assert steps[4].test_results.passed == 2
    # step 2 may not build on failed step 0; step 5 may not build on the superseded 0 and 2
    assert 0 not in steps[2].parents
    assert steps[5].parents and not {0, 2} & set(steps[5].parents)
    assert 4 in steps[5].parents


def test_weaving_keeps_recent_and_ancestors_full_and_summarises_the_rest(signals):
    g = woven_graph()
    r = create("contextweaver").render(g, 2400, signals)
    check_invariants(r, g, signals.counter)
    full_steps = sorted(k for k in range(8) if result_pos(g, k) in r.full)
    assert full_steps == [0, 2, 5, 6, 7]
    assert r.stats["earlier_full"] == [0, 2] and r.stats["parents"] == [2]
    shown = dict(zip(r.positions, r.messages))
    for k in (1, 3, 4):
        m = shown[result_pos(g, k)]
        assert m.rendered_as == "summary" and f"c{k}" in m.content and m.content.endswith(f"note: end of output {k}")
        assert r.reasons[result_pos(g, k)].startswith("summary")
    assert shown[2].content == "Read the parser." and r.stats["model_calls"] == 3
    # a second rendering reuses the cached summaries
    again = create("contextweaver").render(g, 2400, signals)
    assert again.stats["model_calls"] == 0 and again.messages == r.messages


def test_placeholder_variant_needs_no_model():
    def no_model():
        raise AssertionError("the placeholder variant must not build a model")
    g = woven_graph()
    sig = Signals(model_factory=no_model)
    r = create("contextweaver-placeholder").render(g, 2400, sig)
    check_invariants(r, g, sig.counter)
    assert sorted(k for k in range(8) if result_pos(g, k) in r.full) == [0, 2, 5, 6, 7]
    shown = dict(zip(r.positions, r.messages))
    assert all(shown[result_pos(g, k)].rendered_as == "placeholder" for k in (1, 3, 4))


def test_budget_drops_summaries_oldest_first_then_ancestors(signals):
    g = woven_graph()
    roomy = create("contextweaver").render(g, 2400, signals)
    tight = create("contextweaver").render(g, roomy.history_tokens - 1, signals)
    check_invariants(tight, g, signals.counter)
    kinds = {k: dict(zip(tight.positions, tight.messages))[result_pos(g, k)].rendered_as for k in (1, 3, 4)}
    assert kinds == {1: "placeholder", 3: "summary", 4: "summary"}
    assert "dropped oldest first" in tight.reasons[result_pos(g, 1)]
    assert sorted(k for k in range(8) if result_pos(g, k) in tight.full) == [0, 2, 5, 6, 7]
    bare = create("contextweaver-placeholder").render(g, 2400, Signals())
    tighter = create("contextweaver-placeholder").render(g, bare.history_tokens - 1, Signals())
    check_invariants(tighter, g, signals.counter)
    # the oldest ancestor (0) goes before the newer one (2); the recent window stays full
    assert sorted(k for k in range(8) if result_pos(g, k) in tighter.full) == [2, 5, 6, 7]
    assert tighter.reasons[result_pos(g, 0)].startswith("placeholder: neither")


def test_short_results_outrank_model_summaries_when_the_budget_is_tight(signals):
    g = woven_graph()
    short = g.messages[result_pos(g, 1)]
    g = ContextGraph("cw-short", [dataclasses.replace(m, content="guide.md") if m is short else m for m in g.messages])
    whole = create("contextweaver").render(g, None, signals).history_tokens
    roomy = create("contextweaver").render(g, whole - 1, signals)
    assert result_pos(g, 1) in roomy.full  # 8 characters: its own summary, no model call
    assert {dict(zip(roomy.positions, roomy.messages))[result_pos(g, k)].rendered_as for k in (3, 4)} == {"summary"}
    tight = create("contextweaver").render(g, roomy.history_tokens - 1, signals)
    check_invariants(tight, g, signals.counter)
    kinds = {k: dict(zip(tight.positions, tight.messages))[result_pos(g, k)].rendered_as for k in (3, 4)}
    # the oldest model summary (3) goes; the older but exact short result (1) stays
    assert kinds == {3: "placeholder", 4: "summary"} and result_pos(g, 1) in tight.full


def test_full_observations_are_admitted_before_any_summary(signals):
    g = woven_graph()
    big = g.messages[result_pos(g, 5)]  # a recent result too large for what is left of B
    g = ContextGraph("cw-big", [dataclasses.replace(m, content=m.content + FILLER * 2) if m is big else m
                                for m in g.messages])
    bare = create("contextweaver-placeholder").render(g, 1600, Signals())
    assert sorted(k for k in range(8) if result_pos(g, k) in bare.full) == [0, 2, 6, 7]
    r = create("contextweaver").render(g, bare.history_tokens, signals)
    check_invariants(r, g, signals.counter)
    # step 5's summary would have cost the ancestor 0 its place; it waits until the full tiers are done
    assert sorted(k for k in range(8) if result_pos(g, k) in r.full) == [0, 2, 6, 7]
    assert r.reasons[result_pos(g, 5)].startswith("placeholder: neither the full result nor its summary")
    roomy = create("contextweaver").render(g, bare.history_tokens + 200, signals)
    assert dict(zip(roomy.positions, roomy.messages))[result_pos(g, 5)].rendered_as == "summary"
    assert roomy.reasons[result_pos(g, 5)].startswith("summary: full result over B; recent window")


def test_selection_ablations_pick_recent_or_random_earlier_steps(signals):
    g = woven_graph()
    rec = create("contextweaver-recency").render(g, 2400, signals)
    assert rec.stats["earlier_full"] == [2, 3, 4]
    rnd = create("contextweaver-random").render(g, 2400, signals)
    assert len(rnd.stats["earlier_full"]) == 3 and set(rnd.stats["earlier_full"]) <= {0, 1, 2, 3, 4}
    assert create("contextweaver-random").render(g, 2400, signals).stats["earlier_full"] == rnd.stats["earlier_full"]
    check_invariants(rnd, g, signals.counter)


def test_config_rejects_unknown_values():
    with pytest.raises(ValueError, match="selection"):
        create("contextweaver", selection="bm25")
    with pytest.raises(ValueError, match="recent_steps"):
        create("contextweaver", recent_steps=0)


def test_summary_cleaning_limits_length():
    assert clean_summary("  two\n lines  ", 300) == "two lines"
    long = clean_summary("word " * 100, 300)
    assert len(long) <= 300 and long.endswith("…")


def test_analyzer_answer_parsing():
    elig = [0, 3, 4, 7, 12]
    assert parse_parent_ids("[12, 7]", elig) == [12, 7]
    assert parse_parent_ids("```json\n[3]\n```", elig) == [3]
    assert parse_parent_ids('Steps [99, 3, 3, "4"] matter', elig) == [3, 4]
    assert parse_parent_ids("[0, 3, 4, 7]", elig) == [0, 3, 4]
    assert parse_parent_ids("[true, 4]", elig) == [4]
    assert parse_parent_ids("[]", elig) == []
    assert parse_parent_ids("It builds on step 3.", elig) is None
    assert parse_parent_ids("[see above] then [4]", elig) == [4]
    assert parse_parent_ids("[99]", elig) is None


def test_analyzer_prompt_and_fallback():
    g = woven_graph()
    low = lowcost_selector(ParentScoring())
    model = ScriptedModel(answers=["[0]"])
    sig = Signals(model_factory=lambda: model)
    steps = build_steps(g, llm_selector(g, sig, low), "llm-a")
    assert [s.parents for s in steps][1:] == [(0,)] * 7  # every step with candidates asked once
    user = model.calls[-1][1]["content"]
    assert "[2] (read cli.py) 'bash: grep -n parse_line src/app/cli.py' -> 'cli.py:12: value" in user
    assert "Latest step 7:" in user and "['cli.py']" in user and user.startswith("Task (truncated): Fix the cli bug.")
    garbage = ScriptedModel(answers=["I cannot tell."])
    steps = build_steps(g, llm_selector(g, Signals(model_factory=lambda: garbage), low), "llm-b")
    assert [s.parents for s in steps] == [(), (), (0,), (), (), (), (), (2,)]  # the low-cost choice
    msgs = build_prompt("task", steps, 7, [0, 1, 2], {0: "x", 1: "y", 2: "z", 7: "w"})
    assert "[0]" in msgs[1]["content"] and "[3]" not in msgs[1]["content"]


def test_rendering_carries_validation_counts_and_the_f1_summary():
    g = trajectory([("Run tests.", "pytest tests/test_cli.py", PYTEST_FAIL + "\n" + FILLER)]
                   + [(f"Look {k}.", f"echo {k}", FILLER + str(k)) for k in range(6)]
                   + [("Retest.", "pytest tests/test_cli.py", PYTEST_PASS)])
    r = create("contextweaver-placeholder").render(g, 1500, Signals())
    assert r.stats["validation"] == {"passed": 1, "failed": 0, "unknown": 6, "superseded": 1}
    assert r.stats["test_summary"] == "TEST STATUS:\n✓ test_raw: PASSED\n✓ test_split: PASSED"


@pytest.mark.lm
def test_local_model_writes_a_bounded_cached_summary():
    """The real default model path (local SmolLM2 unless an endpoint is configured): one call."""
    pytest.importorskip("torch", reason="the 'llm' extra is not installed")
    from historygraph.policies.contextweaver.policy import ContextWeaverConfig, Summarizer

    g = woven_graph()
    step = build_steps(g, lowcost_selector(ParentScoring()), "t")[0]
    summarizer = Summarizer(Signals(store=MemoryStore()), ContextWeaverConfig(summary_max_tokens=24, summary_input_chars=300))
    first = summarizer.summary(step, g.messages[result_pos(g, 0)].content)
    again = summarizer.summary(step, g.messages[result_pos(g, 0)].content)
    assert 0 < len(first) <= 300 and "\n" not in first and again == first
    assert summarizer.usage.calls == 1 and summarizer.usage.output_tokens <= 24


@pytest.mark.parametrize("sizes", [[10, 20], [19_990, 30], [20_000, 5], [19_999, 7], [5, 19_994, 3], [25_000], [0, 0, 40]])
def test_step_files_and_identifiers_are_those_of_its_joined_text(sizes):
    """A step's files and identifiers (computed per result, joined texts cut at their newlines)
    are those :func:`files_in` / :func:`identifiers_in` find in the action, the thought and the
    first 20,000 characters of the results joined by newlines (ContextWeaver §3.1's features),
    also where that cut falls inside a result, on its newline or just after it."""
    from historygraph.signals.steps.features import FEATURE_CHARS, extract

    unit = "see src/pkg/mod_a.py and FooBar.run_all in http://x.org/y.py; "
    contents = [(unit * (n // len(unit) + 1))[:n] for n in sizes]
    calls = tuple(ToolCall(f"c{i}", "bash", json.dumps({"command": f"cat lib/file_{i}.py"})) for i in range(len(sizes)))
    msgs = [Message("assistant", "Look at setup_cfg.toml, then parse_args", calls)]
    msgs += [Message("tool", c, tool_call_id=f"c{i}") for i, c in enumerate(contents)]
    action = action_text(ContextGraph("s", msgs), 0)
    head = "\n".join(contents)[:FEATURE_CHARS]
    _, files, idents, _ = extract(msgs, 0, tuple(range(1, len(msgs))), with_run=False)
    assert files == files_in(action + "\n" + msgs[0].content + "\n" + head)
    assert idents == identifiers_in(action + "\n" + head)


def test_file_names_found_per_path_run_are_those_of_the_whole_pattern(traces_dir):
    """``files_in`` (the path pattern tried at the start of each run of path characters) finds the
    names ``_FILE.findall`` finds over the text with URLs blanked, on every message and tool-call
    argument of the real traces and on texts made to test its edges (URLs, dots, slashes, dashes,
    non-ASCII word characters next to a path)."""
    from historygraph.traces import read_traces
    from historygraph.signals.steps import features as steps

    def by_pattern(text):
        return frozenset(m.rsplit("/", 1)[-1] for m in steps._FILE.findall(steps._URL.sub(" ", text)))

    texts = ["see a/b.py, x.py. and é/c.md -d.txt .e.py f..py g/.h.py /i.py/ j.py-k https://u.v/w.py l.pyc",
             "ok.cfg:12 (m.toml) n.yaml.bak o.json/ p.py_ q.rs2 r-s.ts t.md\u0130 \u212a.py ٣.py"]
    for tr in read_traces(traces_dir):
        for m in tr.messages:
            texts += [m.content] + [c.arguments for c in m.tool_calls]
    assert all(steps._files_in(t) == by_pattern(t) for t in texts)
