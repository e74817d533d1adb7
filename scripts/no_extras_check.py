"""The library without extras: run in an environment where historygraph is installed with no
optional dependencies (``.ci/run`` makes one), it renders through ``render_messages(...,
session=...)``, :class:`historygraph.Session` and the mini-swe-agent adapter's store path, all on
a SQLite store, and fails if any of them needs a package the core install does not bring (the
server extra's FastAPI or aiohttp, an agent framework). Prints one line per path and exits 1 on
the first failure, naming it."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path


def main() -> int:
    for extra in ("fastapi", "aiohttp", "uvicorn", "langchain", "litellm", "minisweagent"):
        if importlib.util.find_spec(extra) is not None:
            print(f"no-extras check: {extra} is installed here; run this in an environment with historygraph alone", file=sys.stderr)
            return 2
    from historygraph import Session, open_store, render_messages
    from historygraph.integrations.mini_swe_agent import HistoryGraphModel

    history = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix parse_date in utils.py."}]
    for i in range(6):
        history += [{"role": "assistant", "content": f"step {i}", "tool_calls": [
                        {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": f'{{"cmd": "cat file{i}.py"}}'}}]},
                    {"role": "tool", "tool_call_id": f"c{i}", "content": f"def f{i}():\n" + "    x = 1\n" * 300}]
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(str(Path(tmp) / "hg.sqlite"))
        r = render_messages(history, budget=1500, policy="prune", session="no-extras", store=store, explain=True)
        print(f"render_messages(session=...): {len(r.messages)} messages, session {r.session_id}")
        s = Session(budget=1500, policy="prune", store=store)
        for m in history:
            s.add(m)
        print(f"Session: {len(s.render())} messages")

        class Echo:  # the wrapped model of the adapter: answers with a fixed message
            def query(self, messages: list[dict], **kwargs: object) -> dict:
                return {"role": "assistant", "content": f"seen {len(messages)}"}

        model = HistoryGraphModel(Echo(), budget=1500, policy="prune", session="mini", store=store)
        print(f"mini-swe-agent adapter: {model.query(history)['content']}")
        if not (store.has_session("mini") and store.has_session(r.session_id)):
            print("no-extras check: a session was not stored", file=sys.stderr)
            return 1
    print("no-extras check: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
