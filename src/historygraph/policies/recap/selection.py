"""The terms of ReCAP's selection (§3.3) that are not graph state: the protected set ``P_t`` (every
user block and the latest block editing or writing each file, found from the tool calls), the
standardisation ``z`` of the score's terms and the exploration bonus ``ξ_{t,v}`` drawn from a
session-and-turn seed (also the seed of the warm-boundary draw, §5.3)."""

from __future__ import annotations

import hashlib
import json
import random
import re

import numpy as np

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.policies.recap.blocks import Block


_EDIT_TOOL = re.compile(r"edit|write|create|replace|insert|patch", re.I)
_PATH_KEYS = ("path", "file", "file_path", "filename", "target_file")
_SHELL_WRITE = re.compile(r"(?:>>?|\btee\s+(?:-a\s+)?)\s*([\w./-]+\.\w+)|\bsed\s+-i\S*\s+(?:'[^']*'|\"[^\"]*\"|\S+)\s+([\w./-]+)")


def edited_files(message: Message) -> set[str]:
    """Files an assistant message's tool calls edit or write: an edit-like tool's path argument
    (not a ``view`` command), or a shell command's redirect, ``tee`` or ``sed -i`` target."""
    out: set[str] = set()
    for c in message.tool_calls:
        try:
            args = json.loads(c.arguments)
        except ValueError:
            args = {}
        args = args if isinstance(args, dict) else {}
        if _EDIT_TOOL.search(c.name) and args.get("command") != "view":
            out.update(str(args[k]) for k in _PATH_KEYS if isinstance(args.get(k), str))
        command = args.get("command")
        cmd = command if isinstance(command, str) else c.arguments
        for a, b in _SHELL_WRITE.findall(cmd):
            if (a or b) not in ("/dev/null",):
                out.add(a or b)
    return out


def zscore(x: np.ndarray) -> np.ndarray:
    """``(x − mean) / std`` over all entries; zeros when the standard deviation is 0."""
    sd = float(x.std())
    return (x - x.mean()) / sd if sd > 0 else np.zeros_like(x, dtype=float)


def seeded_rng(session_id: str, turn: int) -> random.Random:
    """A generator seeded by session and turn (same draws in every process)."""
    return random.Random(int.from_bytes(hashlib.sha256(f"{session_id}:{turn}".encode()).digest()[:8], "big"))


def exploration_bonus(session_id: str, turn: int, block_ids: list[int]) -> dict[int, float]:
    """ξ_{t,v} ∈ [0.5, 1] for each block id, from a seed fixed by session and turn (§3.3)."""
    rng = seeded_rng(session_id, turn)
    return {b: 0.5 + 0.5 * rng.random() for b in sorted(block_ids)}


def protected_set(graph: ContextGraph, hist: list[Block]) -> set[int]:
    """``P_t`` (§3.3): every user block and the latest block editing or writing each file."""
    latest: dict[str, int] = {}
    for b in hist:
        if b.role == "assistant":
            for f in edited_files(graph.messages[b.positions[0]]):
                latest[f] = b.id
    return {b.id for b in hist if b.role == "user"} | set(latest.values())
