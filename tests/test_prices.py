"""Price models and their simulated prompt caches (issue 37): each rule on hand-computed requests,
the checks of a price-model file, and the cost columns of the replay and the report."""

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from historygraph.cli import app
from historygraph.eval.prices import PriceModelError, load_price_models, read_price_file
from historygraph.eval.prompt_cache import CacheTokens, PromptCache, bill, round_hit
from historygraph.history.events import Message
from historygraph.signals.tokens import TokenCounter

C = TokenCounter("o200k_base")
MODELS = load_price_models()
runner = CliRunner()


def words(n: int, tail: str = "") -> str:
    """``n`` tokens of o200k_base: "x x x ..." (each " x" is one token), then ``tail``."""
    return "x" + " x" * (n - 1) + tail


# every message costs its content plus 3 tokens of overhead (MESSAGE_OVERHEAD)
S = Message("system", words(997))        # 1000 tokens
U1 = Message("user", words(97))          # 100
A1 = Message("assistant", words(197))    # 200
T1 = Message("tool", words(297), tool_call_id="c")         # 300
T1_CUT = Message("tool", words(50, " zebra"), tool_call_id="c")  # 51 + 3 = 54 tokens; its first 50 equal T1's first 50
A2 = Message("assistant", words(97))     # 100
T2 = Message("tool", words(97), tool_call_id="c")          # 100

REQ1 = [S, U1]                           # 1,100 tokens
REQ2 = [S, U1, A1, T1]                   # 1,600 tokens
REQ3 = [S, U1, A1, T1_CUT, A2, T2]       # 1,000 + 100 + 200 + 54 + 100 + 100 = 1,554 tokens: T1 cut by a policy


def send(model, requests, fixed=0):
    cache = PromptCache(model, C, fixed)
    return [cache.observe(r, C.count_messages(r)) for r in requests], cache


def test_the_requests_have_the_token_counts_the_hand_computations_use():
    assert [C.count_messages(r) for r in (REQ1, REQ2, REQ3)] == [1100, 1600, 1554]


def test_openai_rule_caches_from_1024_tokens_in_128_token_steps():
    billed, cache = send(MODELS["openai-style"], [REQ1, REQ2, REQ3])
    # 1: nothing cached yet: 1,100 uncached; the prompt (>= 1,024) becomes an entry
    assert billed[0] == CacheTokens(read=0, write=0, uncached=1100)
    # 2: shares all 1,100 tokens of request 1; 1,024 + 0 whole steps of 128 (76 left over) = 1,024 read
    assert billed[1] == CacheTokens(read=1024, uncached=1600 - 1024)
    # 3: shares S U1 A1 (1,300) + T1_CUT's overhead 3 and 50 leading tokens with request 2 = 1,353;
    #    1,024 + 2 × 128 = 1,280 read (73 left over), 1,554 − 1,280 = 274 uncached
    assert billed[2] == CacheTokens(read=1280, uncached=274)
    assert cache.total == CacheTokens(read=2304, uncached=1100 + 576 + 274)
    # priced: GPT-4.1 input 2.0, cached 0.5, output 8.0 USD per million tokens; 100 output tokens
    assert bill(MODELS["openai-style"], cache.total, output=100) == pytest.approx((2304 * 0.5 + 1950 * 2.0 + 100 * 8.0) / 1e6)


def test_openai_rule_caches_nothing_below_1024_tokens():
    billed, _ = send(MODELS["openai-style"], [[U1, A1], [U1, A1, T1]])  # 300, then 600 tokens
    assert billed == [CacheTokens(uncached=300), CacheTokens(uncached=600)]
    assert round_hit(MODELS["openai-style"], 1023) == 0 and round_hit(MODELS["openai-style"], 1151) == 1024


def test_anthropic_rule_writes_then_reads_at_breakpoints():
    model = MODELS["anthropic-style"]
    assert (model.write_price, model.cached_input) == (3.75, 0.30)  # 1.25× and 0.1× of 3.0
    billed, cache = send(model, [REQ1, REQ2, REQ3])
    # 1: breakpoints after S (1,000 < 1,024: not cacheable) and on U1: the 1,100-token prefix is written
    assert billed[0] == CacheTokens(read=0, write=1100, uncached=0)
    # 2: request 1 (S U1) is an exact prefix 2 blocks before the last breakpoint: 1,100 read, 500 written
    assert billed[1] == CacheTokens(read=1100, write=500)
    # 3: request 2 ends in T1, which the policy cut: no hit there; S U1 is still cached (renewed at 2)
    #    and 4 blocks back: 1,100 read, 454 written (a prefix cache's partial T1 match counts nothing here)
    assert billed[2] == CacheTokens(read=1100, write=454)
    # cost: 2,200 × 0.30 + 2,054 × 3.75, plus 100 output tokens × 15
    assert bill(model, cache.total, output=100) == pytest.approx((2200 * 0.30 + 2054 * 3.75 + 100 * 15.0) / 1e6)


def test_anthropic_rule_reads_the_opening_after_a_re_selection_rewrites_what_follows_it():
    model = MODELS["anthropic-style"]
    # request 2 re-selected: A1 T1 replaced by A2 T2 (1,000 + 100 + 100 + 100 = 1,300 tokens). Request 1
    # wrote two prefixes, S U1 at the opening's breakpoint and S U1 A1 T1 at the last message's: the
    # first is an exact prefix of request 2, 2 blocks before its last breakpoint: 1,100 read, 200 written.
    # Without the opening's breakpoint nothing of request 1 would be a prefix of request 2: 1,300 written.
    billed, _ = send(model, [REQ2, [S, U1, A2, T2]])
    assert billed[0] == CacheTokens(write=1600)
    assert billed[1] == CacheTokens(read=1100, write=200)


def test_anthropic_rule_looks_back_20_blocks_only_and_ignores_short_prompts():
    model = MODELS["anthropic-style"]
    many = [Message("user" if i % 2 else "assistant", "y") for i in range(21)]  # 21 one-block messages
    billed, _ = send(model, [REQ2, REQ2 + many])
    # request 1 (S U1 A1 T1) is 21 blocks back: no hit; only S U1, at the opening's breakpoint, is read
    assert billed[1].read == 1100 and billed[1].write == C.count_messages(REQ2 + many) - 1100
    billed, _ = send(model, [REQ2, REQ2 + many[:20]])
    assert billed[1].read == 1600  # 20 blocks back: a hit
    billed, _ = send(model, [[U1, A1], [U1, A1, T1]])  # 300 and 600 tokens: below 1,024, neither read nor written
    assert billed == [CacheTokens(uncached=300), CacheTokens(uncached=600)]


def test_anthropic_rule_caches_the_tools_and_system_prefix_on_its_own_breakpoint():
    model = MODELS["anthropic-style"]
    # 2,000 tool-schema tokens lead every request: the first breakpoint (after them and S) caches 3,000
    billed, _ = send(model, [REQ1, [S, Message("user", words(10))]], fixed=2000)
    assert billed[0] == CacheTokens(write=3100)
    assert billed[1] == CacheTokens(read=3000, write=13)  # the new user message (10 + 3) is written


def test_deepseek_rule_counts_hits_in_64_token_units():
    billed, _ = send(MODELS["deepseek-style"], [REQ1, REQ2])
    # 1,100 shared tokens = 17 units of 64 (1,088) + 12 left over
    assert billed[1] == CacheTokens(read=1088, uncached=1600 - 1088)
    assert bill(MODELS["deepseek-style"], billed[1], 0) == pytest.approx((1088 * 0.028 + 512 * 0.28) / 1e6)


def test_entries_expire_after_ttl_calls_and_a_budget_error_takes_a_call():
    model = replace(MODELS["openai-style"], ttl_calls=1)
    cache = PromptCache(model, C)
    cache.observe(REQ1, 1100)
    cache.skip()  # no request at call 2
    assert cache.observe(REQ2, 1600).read == 0  # request 1 was last used 2 calls ago


def test_with_the_calls_times_entries_expire_after_ttl_seconds_or_an_hour_with_one_hour():
    """Session logs record when each call was made: Anthropic's 5-minute TTL (300 s unused) instead
    of a count of calls, and the 1-hour TTL billed at 2x input where the session used it."""
    model = MODELS["anthropic-style"]
    assert model.ttl_seconds == 300
    cache = PromptCache(model, C)
    cache.observe(REQ1, 1100, at=1000.0)
    assert cache.observe(REQ2, 1600, at=1200.0) == CacheTokens(read=1100, write=500)  # 200 s later: still cached
    assert cache.observe(REQ2, 1600, at=1550.0) == CacheTokens(write=1600)  # 350 s after its last use: expired
    hour = PromptCache(model, C, one_hour=True)
    hour.observe(REQ1, 1100, at=1000.0)
    t = hour.observe(REQ2, 1600, at=3000.0)  # 2000 s later: within the hour
    assert t == CacheTokens(read=1100, write_1h=500)
    assert bill(model, t, 0) == pytest.approx((1100 * 0.30 + 500 * 3.0 * 2) / 1e6)
    assert hour.observe(REQ2, 1600, at=6700.0) == CacheTokens(write_1h=1600)  # 3700 s unused: expired
    calls = PromptCache(model, C)  # without times, 20 calls as before
    calls.observe(REQ1, 1100)
    assert calls.observe(REQ2, 1600).read == 1100


def test_the_contextrender_model_is_the_prefix_reuse_of_eval_cache():
    from historygraph.eval.cache import PrefixReuse
    reuse = PrefixReuse(C, 40)
    billed, _ = send(MODELS["contextrender"], [REQ1, REQ2, REQ3], fixed=40)
    assert [b.read for b in billed] == [reuse.observe(r, C.count_messages(r)) for r in (REQ1, REQ2, REQ3)]


def write(tmp_path, text):
    p = tmp_path / "p.toml"
    p.write_text(text)
    return p


OK = 'caching = "automatic"\ninput = 1.0\ncached_input = 0.1\noutput = 2.0\nttl_calls = 5\n'


@pytest.mark.parametrize("text, says", [
    ("[m]\n" + OK + "colour = 1\n", "price model [m]: unknown key 'colour'; known keys:"),
    ("[m]\n" + OK.replace("input = 1.0", 'input = "cheap"'), "price model [m]: key 'input': expected a number >= 0 (USD per million tokens), got 'cheap'"),
    ("[m]\n" + OK.replace("output = 2.0", "output = -1"), "key 'output': expected a number >= 0"),
    ("[m]\n" + OK.replace("ttl_calls = 5", "ttl_calls = 0"), "key 'ttl_calls': expected a whole number >= 1, got 0"),
    ("[m]\n" + OK.replace("ttl_calls = 5\n", ""), "price model [m]: key 'ttl_calls' is missing"),
    ("[m]\n" + OK.replace('"automatic"', '"magic"'), "key 'caching': expected one of 'automatic', 'breakpoints', got 'magic'"),
    ("[m]\n" + OK + "lookback_blocks = 20\n", "key 'lookback_blocks' applies to caching = \"breakpoints\" only"),
    ("[m]\n" + OK.replace('"automatic"', '"breakpoints"') + "max_breakpoints = 5\n", "key 'max_breakpoints': expected 2 to 4"),
    ("[m]\n" + OK.replace('"automatic"', '"breakpoints"') + "step = 64\n", "key 'step' applies to caching = \"automatic\" only"),
    ("m = 3\n", "price model [m]: expected a table of keys"),
    ("[m\n", "not valid TOML"),
    ("", "no price model"),
])
def test_a_price_file_error_names_the_table_the_key_and_what_is_expected(tmp_path, text, says):
    path = write(tmp_path, text)
    with pytest.raises(PriceModelError, match=None) as e:
        read_price_file(path)
    assert says in str(e.value) and str(path) in str(e.value)


def test_a_users_table_is_added_and_one_of_a_shipped_name_replaces_it(tmp_path):
    path = write(tmp_path, "[mine]\n" + OK + "\n[openai-style]\n" + OK)
    models = load_price_models(path)
    assert list(models)[:4] == ["contextrender", "openai-style", "anthropic-style", "deepseek-style"]
    assert models["openai-style"].input == 1.0 and models["mine"].cached_input == 0.1 and models["mine"].write_price == 1.0


def test_replay_rejects_a_bad_price_file_and_an_unknown_price_model(tmp_path):
    bad = write(tmp_path, "[m]\n" + OK + "colour = 1\n")
    res = runner.invoke(app, ["replay", "--store", ":memory:", "--out", str(tmp_path / "o"), "--prices", str(bad)])
    assert res.exit_code == 2 and "--prices:" in res.output and "unknown key 'colour'" in res.output
    res = runner.invoke(app, ["replay", "--store", ":memory:", "--out", str(tmp_path / "o"), "--price-model", "nope"])
    assert res.exit_code == 2 and "unknown price model 'nope'; loaded: contextrender, openai-style" in res.output
    assert not (tmp_path / "o").exists()


@pytest.mark.slow  # replays the example trace twice (prune, full) and writes a report: about 10 CPU s
def test_replay_table_shows_the_cost_with_each_cache_and_report_reprices(tmp_path, monkeypatch):
    import historygraph.cli.replay
    import historygraph.cli.tables
    from rich.console import Console

    for module in (historygraph.cli.replay, historygraph.cli.tables):  # where the main columns fit on one line
        monkeypatch.setattr(module, "console", Console(width=250))
    mine = write(tmp_path, "[gpt-cheap]\n" + OK.replace("ttl_calls = 5", "ttl_calls = 20") + "min_tokens = 1024\nstep = 128\n")
    base = ["replay", "-p", "prune", "-p", "full", "--budget", "1500", "--store", ":memory:"]
    res = runner.invoke(app, base + ["--out", str(tmp_path / "a"), "--prices", str(mine)])
    assert res.exit_code == 0, res.output
    header = next(line for line in res.output.splitlines() if "recall %" in line)
    for m in ("CR-eq3", "openai-style", "anthropic-style", "deepseek-style", "gpt-cheap"):  # CR-eq3: the price model contextrender
        assert f"cost {m}" in header
    assert "cost (Full ρ)" not in header and "cost M: cost with price model M's simulated prompt cache" in res.output
    data = json.loads((tmp_path / "a" / "replay.json").read_text())
    rows = {r["policy"]: r for r in data["per_source"] if r["source"] == "ALL"}
    assert rows["full"]["cost_cache_openai-style"] == 1.0 and rows["full"]["norm_cost"] == 1.0  # eq. 3 kept in the JSON
    # the contextrender model is eq. 3 priced with the policy's own prefix reuse
    assert rows["prune"]["cost_cache_contextrender"] == rows["prune"]["norm_cost_own"]
    assert set(data["meta"]["price_models"]) == {"contextrender", "openai-style", "anthropic-style", "deepseek-style", "gpt-cheap"}
    assert "cost_cache_anthropic-style" in (tmp_path / "a" / "replay.csv").read_text().splitlines()[0]
    only = runner.invoke(app, base + ["--out", str(tmp_path / "b"), "--price-model", "anthropic-style"])
    header = next(line for line in only.output.splitlines() if "recall %" in line)
    assert "cost anthropic-style" in header and "cost openai-style" not in header
    # report: the decisive plot first; --prices reprices with a model of a simulated rule, refuses another
    same_rule = write(tmp_path, "[gpt-dear]\n" + OK.replace("ttl_calls = 5", "ttl_calls = 20").replace("input = 1.0", "input = 9.0")
                      + "min_tokens = 1024\nstep = 128\nttl_seconds = 300\n")
    res = runner.invoke(app, ["report", str(tmp_path / "b"), "--prices", str(same_rule)])
    assert res.exit_code == 0, res.output
    page = (tmp_path / "b" / "report.html").read_text()
    # after the recommendation (its own small table), the decisive plot, then the data tables
    rec, plot = page.index("<h2>Recommended policy</h2>"), page.index("Recall against the cost with each provider")
    second_table = page.index("<table", page.index("</table>"))
    assert rec < page.index("<table") < plot < second_table < page.index("Recall against normalised inference cost")
    assert "cost gpt-dear" in page
    other = write(tmp_path, "[slow]\n" + OK.replace("ttl_calls = 5", "ttl_calls = 7"))
    res = runner.invoke(app, ["report", str(tmp_path / "b"), "--prices", str(other)])
    assert res.exit_code == 2 and "price model [slow]: its cache rule" in res.output and "replay with --prices FILE" in res.output
