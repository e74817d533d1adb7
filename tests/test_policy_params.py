"""Policy parameters: type checks in create(), -P / --params on the CLI, TOML files, the proxy's
config; and policies from installed plugins (entry point group historygraph.policies)."""

from __future__ import annotations

import sys
import textwrap

import pytest
from typer.testing import CliRunner

from historygraph import PolicyError, create
from historygraph.cli import app
from historygraph.history.events import Message, ToolCall
from historygraph.policies import REGISTRY, load_plugins, params
from historygraph.store import open_store

runner = CliRunner()


def test_create_names_the_field_and_the_expected_type():
    with pytest.raises(PolicyError, match=r"policy 'cw-sliding-window' parameter 'n': expected int, got str '3'"):
        create("cw-sliding-window", n="3")
    with pytest.raises(PolicyError, match=r"parameter 'use_graph': expected bool, got int 1"):
        create("recap", use_graph=1)
    with pytest.raises(PolicyError, match=r"parameter 'n': expected int, got bool True"):
        create("cw-sliding-window", n=True)
    # a range check of the policy's own Config is a PolicyError naming the policy too
    with pytest.raises(PolicyError, match=r"policy 'cw-sliding-window': window config: n must be ≥ 0, got -1"):
        create("cw-sliding-window", n=-1)
    assert create("contextrender", w_rec=1).config.w_rec == 1  # an int where a float is expected is fine
    assert create("cw-sliding-window", n=3).config.n == 3


def test_cli_items_are_converted_to_the_field_type():
    both = ["cw-sliding-window", "observation-masking"]
    assert params.parse_cli(["n=3"], both) == {"cw-sliding-window": {"n": 3}, "observation-masking": {"n": 3}}
    assert params.parse_cli(["observation-masking.n=2"], both) == {"observation-masking": {"n": 2}}
    assert params.parse_cli(["w_rec=0.25", "lam=1"], ["contextrender"]) == {"contextrender": {"w_rec": 0.25, "lam": 1}}
    assert params.parse_cli(["use_graph=false"], ["recap"]) == {"recap": {"use_graph": False}}
    with pytest.raises(PolicyError, match=r"parameter 'n': expected int, got 'three'"):
        params.parse_cli(["n=three"], both)
    with pytest.raises(PolicyError, match=r"none of the chosen policies \(prune\) has a parameter 'n'"):
        params.parse_cli(["n=3"], ["prune"])
    with pytest.raises(PolicyError, match=r"expected name=value"):
        params.parse_cli(["n"], both)
    with pytest.raises(PolicyError, match=r"'nope' is not a registered policy"):
        params.parse_cli(["nope.n=1"], both)


def test_toml_file_is_checked_and_errors_name_the_file(tmp_path):
    good = tmp_path / "p.toml"
    good.write_text('[cw-sliding-window]\nn = 3\n\n[contextrender]\nw_rec = 0.5\n')
    assert params.load_file(good) == {"cw-sliding-window": {"n": 3}, "contextrender": {"w_rec": 0.5}}
    bad = tmp_path / "bad.toml"
    bad.write_text('[cw-sliding-window]\nn = "3"\n')
    with pytest.raises(PolicyError, match=r"bad.toml: policy 'cw-sliding-window' parameter 'n': expected int, got str '3'"):
        params.load_file(bad)
    broken = tmp_path / "broken.toml"
    broken.write_text('[cw-sliding-window\nn = 3\n')
    with pytest.raises(PolicyError, match=r"broken.toml: not valid TOML: .*line 1"):
        params.load_file(broken)
    flat = tmp_path / "flat.toml"
    flat.write_text('n = 3\n')
    with pytest.raises(PolicyError, match=r"'n' must be a \[table\] of one policy's parameters"):
        params.load_file(flat)


def _store(tmp_path) -> str:
    """8 results of about 300 tokens (the test_cli render scenario): at B = 2200 the default n = 6
    leaves r0 and r1 as placeholders; at B = 2500 seven fit (7 × 306 + 8 × 8 + 28 < 2500)."""
    path = str(tmp_path / "s.sqlite")
    db = open_store(path)
    db.create_session("s1")
    msgs = [Message("user", "find the bug")]
    for i in range(8):
        msgs += [Message("assistant", f"step {i}", (ToolCall(f"r{i}", "bash", "{}"),)),
                 Message("tool", f"r{i} " + "data " * 300, tool_call_id=f"r{i}")]
    db.append("s1", msgs)
    db.close()
    return path


def test_render_takes_parameters_from_the_command_line_and_a_file(tmp_path):
    path = _store(tmp_path)
    base = ["render", "s1", "-p", "cw-sliding-window", "-b", "2500", "--store", path]
    res = runner.invoke(app, base + ["-P", "n=7"])
    assert res.exit_code == 0 and "omitted result ids: r0\n" in res.output, res.output
    f = tmp_path / "p.toml"
    f.write_text("[cw-sliding-window]\nn = 5\n")
    res = runner.invoke(app, base + ["--params", str(f)])
    assert res.exit_code == 0 and "omitted result ids: r0 r1 r2\n" in res.output, res.output
    res = runner.invoke(app, base + ["--params", str(f), "-P", "n=7"])  # -P overrides the file
    assert res.exit_code == 0 and "omitted result ids: r0\n" in res.output, res.output
    res = runner.invoke(app, base + ["-P", "n=x"])
    assert res.exit_code == 2 and "parameter 'n': expected int, got 'x'" in res.output


def test_the_proxy_config_checks_its_parameters():
    from historygraph.server.config import ServerConfig

    with pytest.raises(PolicyError, match=r"parameter 'n': expected int, got str 'x'"):
        ServerConfig(store=":memory:", policy="prune", policy_params={"cw-sliding-window": {"n": "x"}})
    res = runner.invoke(app, ["serve", "--store", ":memory:", "-P", "cw-sliding-window.n=x"])
    assert res.exit_code == 2 and "parameter 'n': expected int, got 'x'" in res.output


def _plugin(tmp_path, monkeypatch, name: str, module_text: str, value: str):
    """An installed distribution on sys.path declaring one entry point (what pip writes)."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(module_text))
    info = tmp_path / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[historygraph.policies]\n{value}\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_plugin_policy_is_registered_and_renders(tmp_path, monkeypatch):
    _plugin(tmp_path, monkeypatch, "hg_demo_plugin", '''
        from dataclasses import dataclass

        from historygraph.render import Layout


        class KeepNone:
            """Shows every tool result as a placeholder."""

            source = "a test plugin"

            @dataclass(frozen=True)
            class Config:
                label: str = "none"

            def __init__(self, name="keep-none", config=None):
                self.name, self.config = name, config or self.Config()

            def render(self, graph, budget, signals):
                layout = Layout(graph, signals.counter, budget)
                return layout.assemble(self.name, layout.selection())
        ''', "keep-none = hg_demo_plugin:KeepNone")
    try:
        assert load_plugins() == ["keep-none"]
        assert REGISTRY["keep-none"].source == "a test plugin"
        assert REGISTRY["keep-none"].summary == "Shows every tool result as a placeholder."
        from historygraph import render_messages

        out = render_messages([{"role": "user", "content": "go"},
                               {"role": "assistant", "content": "", "tool_calls": [
                                   {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                               {"role": "tool", "tool_call_id": "c1", "content": "result " * 500},
                               # (a later reply: c1 is not the newest result, which every policy shows, invariant §5.9)
                               {"role": "assistant", "content": "done"},
                               {"role": "user", "content": "next"}], budget=100, policy=create("keep-none", label="x"))
        assert out[2]["content"].startswith("[tool result c1 omitted")
        with pytest.raises(PolicyError, match=r"policy 'keep-none' parameter 'label': expected str, got int 1"):
            create("keep-none", label=1)
    finally:
        REGISTRY.pop("keep-none", None)
        sys.modules.pop("hg_demo_plugin", None)


def test_a_broken_plugin_is_skipped_with_a_warning_naming_it(tmp_path, monkeypatch):
    _plugin(tmp_path, monkeypatch, "hg_broken_plugin", "raise ImportError('needs torch 99')\n",
            "broken = hg_broken_plugin:Nothing")
    n = len(REGISTRY)
    with pytest.warns(RuntimeWarning, match=r"plugin 'broken' \(hg_broken_plugin:Nothing\) not loaded: ImportError: needs torch 99"):
        assert load_plugins() == []
    assert len(REGISTRY) == n
