"""Every Python block of docs/library.md runs as written, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "library.md"


@pytest.mark.slow  # the page's blocks import LangChain, the Agents SDK and LiteLLM: about 8 CPU s (docs/tests.md)
def test_library_page_blocks_run(capsys):
    scope: dict = {}
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) >= 3
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/library.md block {i + 1}", "exec"), scope)
    printed = capsys.readouterr().out
    assert "[tool result c1 omitted from this context (400 tokens)" in printed
    assert "[3] " in printed  # r.rendering.omitted
    assert "wordllama-l2-supercat-256\n" in printed and len(scope["shown"]) == 4  # "Choosing the sentence embedder"
    assert scope["record"]["forms"] == {"placeholder": [3]} and scope["record"]["omitted"] == 1  # what was left out
    assert "Hello.\nok\n" in printed  # the LangChain agent and the LiteLLM call ran
    assert scope["model"].budget == 6000 and scope["run_config"].call_model_input_filter.budget == 6000
    # "Letting the model recall": the omitted result comes back whole; each adapter's tool is built
    assert "[tool result c1 omitted from th\n" in printed and scope["recalled"] == "line\n" * 200
    assert [t.name for t in scope["lc_mw"].tools] == ["historygraph_recall"]
    assert [t.name for t in scope["agent"].tools] == ["historygraph_recall"]
    assert scope["RECALL_TOOL"]["function"]["name"] == "historygraph_recall" and scope["answers"] == []
    assert scope["to_send"][2]["content"][0]["tool_use_id"] == "t1"
    assert "t1" in scope["to_send"][2]["content"][0]["content"]
