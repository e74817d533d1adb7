"""The fake provider's prompt caches (``python tests/fake_upstream.py --prompt-cache``): each API's
cache simulated in memory, and each answer's ``usage`` reported as that provider reports it. A test
double: it lives with the tests.

Tokens are the proxy's tokenizer (:class:`historygraph.signals.tokens.TokenCounter`) over what a
message says (its text, a tool call's name and input, a result's text; other blocks as JSON), plus
:data:`PER_MESSAGE` per message and the tool schemas' JSON: about the proxy's own estimate, so its
calibration stays near 1.

* **OpenAI** (Chat Completions and Responses; platform.openai.com/docs/guides/prompt-caching):
  automatic; a request of at least :data:`OPENAI_MIN` tokens is cached whole, and a later request
  of the same model reads the longest token prefix it shares with a cached one, rounded down to
  :data:`OPENAI_MIN` plus whole :data:`OPENAI_STEP` units (0 below :data:`OPENAI_MIN`). Usage:
  ``prompt_tokens`` (Responses ``input_tokens``) is the whole prompt, of which
  ``prompt_tokens_details.cached_tokens`` (``input_tokens_details.cached_tokens``) were read.
* **Anthropic** (docs.anthropic.com/en/docs/build-with-claude/prompt-caching): the prompt is the
  sequence of blocks tools, ``system``, message content (a string content is one text block; the
  ``cache_control`` markers are not part of it). Only a prefix that ends at a block with
  ``cache_control`` (a top-level ``cache_control``: the last block that may carry one) and has at
  least :data:`ANTHROPIC_MIN` tokens is written; a request reads the longest cached prefix that
  ends at most :data:`LOOKBACK` blocks before one of its breakpoints. Usage: ``input_tokens`` (after
  the last breakpoint, or all when nothing is cached), ``cache_read_input_tokens``,
  ``cache_creation_input_tokens`` (up to the last breakpoint, not read), split in ``cache_creation``
  into ``ephemeral_1h_input_tokens`` (up to the last breakpoint with ``"ttl": "1h"``) and
  ``ephemeral_5m_input_tokens`` (the rest), as Anthropic reports a request that mixes the two TTLs.

Entries never expire (a test run lasts seconds; the providers keep them 5 minutes or more).
"""

from __future__ import annotations

import hashlib
import json
import threading
from functools import lru_cache
from typing import Any

from historygraph.signals.tokens import TokenCounter

OPENAI_MIN, OPENAI_STEP = 1024, 128
ANTHROPIC_MIN = 1024  # Claude Sonnet 4.5's minimum cacheable prompt
LOOKBACK = 20
PER_MESSAGE = 3
KEEP = 64  # OpenAI entries kept per model, newest first

_counter = TokenCounter()


@lru_cache(maxsize=8192)
def _ids(text: str) -> tuple[int, ...]:
    return tuple(_counter.encode(text))


def _text(value: Any) -> str:
    """What a block, a message content or a tool input says, as text."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_text(v) for v in value)
    if isinstance(value, dict):
        kind = value.get("type")
        if kind in ("text", "input_text", "output_text"):
            return str(value.get("text", ""))
        if kind == "thinking":
            return str(value.get("thinking", ""))
        if kind in ("tool_use", "function_call"):
            return str(value.get("name", "")) + json.dumps(value.get("input", value.get("arguments")), sort_keys=True)
        if kind in ("tool_result", "function_call_output"):
            return _text(value.get("content", value.get("output", "")))
        if kind == "message" or "role" in value:
            return _text(value.get("content"))
        return json.dumps({k: v for k, v in value.items() if k != "cache_control"}, sort_keys=True)
    return "" if value is None else json.dumps(value)


def rounded_hit(match: int) -> int:
    """OpenAI's cached part of a ``match``-token shared prefix."""
    return 0 if match < OPENAI_MIN else OPENAI_MIN + (match - OPENAI_MIN) // OPENAI_STEP * OPENAI_STEP


def openai_items(api: str, body: dict[str, Any]) -> list[tuple[int, ...]]:
    """The prompt's token ids per item: the tool schemas, then each message (Chat Completions) or
    the instructions and each input item (Responses), a role marker leading each."""
    tools = [_ids(json.dumps(body["tools"], sort_keys=True))] if body.get("tools") else []
    if api == "responses":
        items = body.get("input")
        items = [{"role": "user", "content": items}] if isinstance(items, str) else list(items or [])
        if body.get("instructions"):
            items.insert(0, {"role": "system", "content": body["instructions"]})
    else:
        items = list(body.get("messages") or [])
    out = list(tools)
    for m in items:
        if not isinstance(m, dict):
            continue
        calls = "".join(c.get("function", {}).get("name", "") + c.get("function", {}).get("arguments", "")
                        for c in m.get("tool_calls") or [])
        out.append(_ids(f"<|{m.get('role') or m.get('type')}|>" + _text(m.get("content", m)) + calls))
    return out


def _shared(a: list[tuple[int, ...]], b: list[tuple[int, ...]]) -> int:
    """Tokens of the longest common prefix of two item lists (whole items, then tokens)."""
    n = 0
    for x, y in zip(a, b):
        if x == y:
            n += len(x)
            continue
        for s, t in zip(x, y):
            if s != t:
                break
            n += 1
        break
    return n


def anthropic_blocks(body: dict[str, Any]) -> tuple[list[str], list[int], list[int], set[int]]:
    """The prompt as (each block's key, each block's tokens, the indices of its breakpoints, those
    of the breakpoints with the 1-hour TTL)."""
    keys: list[str] = []
    tokens: list[int] = []
    marks: list[int] = []
    hour: set[int] = set()

    def add(role: str, block: Any, first: bool) -> None:
        if isinstance(block, dict) and isinstance(block.get("cache_control"), dict):
            marks.append(len(keys))
            if block["cache_control"].get("ttl") == "1h":
                hour.add(len(keys))
        plain = {k: v for k, v in block.items() if k != "cache_control"} if isinstance(block, dict) else block
        keys.append(json.dumps([role, first, plain], sort_keys=True))
        tokens.append(len(_ids(_text(plain))) + (PER_MESSAGE if first else 0))

    for t in body.get("tools") or []:
        add("tool", t, False)
    system = body.get("system")
    for j, b in enumerate([{"type": "text", "text": system}] if isinstance(system, str) and system else system or []):
        add("system", b, j == 0)
    for turn in body.get("messages") or []:
        content = turn.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        for j, b in enumerate(blocks):
            add(str(turn.get("role")), b, j == 0)
    if isinstance(body.get("cache_control"), dict):
        last = max((i for i, k in enumerate(keys) if '"type": "thinking"' not in k and '"type": "redacted_thinking"' not in k),
                   default=None)
        if last is not None and last not in marks:
            marks.append(last)
    return keys, tokens, sorted(marks), hour


class PromptCaches:
    """The caches of one fake provider process (thread-safe): :meth:`usage` of each request, in the
    order they arrive, gives its ``usage`` object and records what it cached."""

    def __init__(self) -> None:
        self.openai: dict[str, list[list[tuple[int, ...]]]] = {}
        self.anthropic: set[str] = set()  # prefix hashes (model included) of cached prefixes
        self._lock = threading.Lock()

    def usage(self, api: str, body: dict[str, Any]) -> dict[str, Any]:
        """The ``usage`` object (``api``: ``"openai"``, ``"responses"`` or ``"anthropic"``)."""
        with self._lock:
            if api == "anthropic":
                return self._anthropic(body)
            items = openai_items(api, body)
            total = sum(len(x) for x in items)
            entries = self.openai.setdefault(str(body.get("model")), [])
            cached = rounded_hit(min(total, max((_shared(e, items) for e in entries), default=0)))
            if total >= OPENAI_MIN:
                entries.insert(0, items)
                del entries[KEEP:]
        if api == "responses":
            return {"input_tokens": total, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": 1,
                    "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": total + 1}
        return {"prompt_tokens": total, "completion_tokens": 1, "total_tokens": total + 1,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def _anthropic(self, body: dict[str, Any]) -> dict[str, Any]:
        keys, tokens, marks, hour = anthropic_blocks(body)
        chain, h = [], hashlib.sha256(str(body.get("model")).encode())
        cum = [0]
        for k, n in zip(keys, tokens):
            h = h.copy()
            h.update(k.encode())
            chain.append(h.hexdigest())
            cum.append(cum[-1] + n)
        read = 0
        for b in marks:
            hit = next((i for i in range(b, max(-1, b - LOOKBACK - 1), -1) if chain[i] in self.anthropic), None)
            if hit is not None:
                read = max(read, cum[hit + 1])
        written = 0
        for b in marks:
            if cum[b + 1] >= ANTHROPIC_MIN:
                self.anthropic.add(chain[b])
        if marks and cum[marks[-1] + 1] >= ANTHROPIC_MIN:
            written = cum[marks[-1] + 1] - read
        long = min(written, max(0, max((cum[b + 1] for b in marks if b in hour), default=0) - read))
        return {"input_tokens": cum[-1] - read - written, "cache_creation_input_tokens": written,
                "cache_creation": {"ephemeral_5m_input_tokens": written - long, "ephemeral_1h_input_tokens": long},
                "cache_read_input_tokens": read, "output_tokens": 1}


def with_usage(reply: Any, usage: dict[str, Any]) -> Any:
    """``reply`` (an answer object, or a stream's SSE event strings) with its ``usage`` replaced:
    a Messages or Chat Completions object's ``usage``, a Responses object's ``usage``; in a stream
    Anthropic's ``message_start`` (and the input fields of ``message_delta``), the Chat
    Completions usage chunk and ``response.completed``."""
    if isinstance(reply, dict):
        if reply.get("object") == "response" and reply.get("usage") is not None:
            return {**reply, "usage": usage}
        return {**reply, "usage": usage} if "usage" in reply else reply
    out = []
    for e in reply:
        head, sep, data = e.partition("data: ")
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            out.append(e)
            continue
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "message_start":
            event["message"]["usage"] = {**usage, "output_tokens": 1}
        elif kind == "message_delta":
            event["usage"] = {**usage, **(event.get("usage") or {})}
        elif kind == "response.completed":
            event["response"]["usage"] = usage
        elif isinstance(event, dict) and event.get("usage") is not None:
            event["usage"] = usage
        else:
            out.append(e)
            continue
        out.append(head + sep + json.dumps(event) + "\n\n")
    return out
