"""The documented library example runs as written."""

import re
from pathlib import Path


def test_usage_library_example_runs():
    text = (Path(__file__).resolve().parents[1] / "docs" / "usage.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    scope: dict = {}
    exec(compile(block, "docs/usage.md", "exec"), scope)
    assert scope["messages"][-1] == {"role": "tool", "content": '[{"email": "tr_solo@gmail.com"}]', "tool_call_id": "c1"}
