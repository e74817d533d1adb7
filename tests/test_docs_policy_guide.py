"""docs/writing-a-policy.md: its policy example registers, renders and passes the invariants."""

from __future__ import annotations

import re
from pathlib import Path

from historygraph.policies import REGISTRY

DOC = Path(__file__).resolve().parents[1] / "docs" / "writing-a-policy.md"


def test_the_guide_example_runs(capsys):
    block = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    try:
        exec(compile(block, "docs/writing-a-policy.md", "exec"), {})
        printed = capsys.readouterr().out
        # B = 200: b (20 lines, ~28 tokens) fits and a (300 lines) does not; max_results = 1
        assert printed.startswith("[tool result a omitted from this context | b\nb\nb\n")
        assert REGISTRY["shortest-first"].summary.startswith("Shows the shortest tool results whole")
    finally:
        REGISTRY.pop("shortest-first", None)
