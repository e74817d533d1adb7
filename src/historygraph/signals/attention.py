"""Attention over a served context, from a proxy model or from the caller (ReCAP §3.2, §5 proxy study).

ReCAP turns attention from a completed user turn into block importance and dependency edges. Any
model that replays the served context with its own tokenizer can supply it, because everything is
mapped back to messages (and, by the policy, to blocks). One interface, two implementations:

* :class:`ProxyAttention`: SmolLM2-135M-Instruct (:func:`historygraph.models.smollm2.load_smollm2`,
  eager attention, 30 layers × 9 heads, 8,192-token context) re-reads the served context.
* :class:`CallerAttention`: a serving engine that exposes attention rows hands them in.

Both return a :class:`TokenAttention`; :func:`consolidate` clips it and reduces it to per-message
figures, which are small enough to cache by content hash.

Proxy defaults (the paper gives none; chosen a priori, not tuned on the evaluation traces):

* **Window**: the last ``window_tokens = 512`` tokens of the served context, i.e. the end of the
  completed turn and whatever history precedes it inside the window. 512 tokens is what one CPU
  forward pass with attentions does in about 2.3 s on 2 cores (OFFLINE.md); the proxy allows up to
  8,192. Messages entirely before the window are not observed (they keep their scores, §3.2).
* **Rows** ``W_t``: up to ``sample_rows = 32`` query positions spread evenly over the completed
  turn's tokens inside the window, plus the last token of every completed-turn message there, so
  that each dependent block has at least one row for its edges.
* **Layers**: heads averaged over layers 6, 12, 18 and 24 (spread over the depth, skipping the
  first layers, whose attention is mostly positional) for importance; layer 15 (the middle) for
  dependency edges.
* **Clipping**: each row is clipped at its ``clip_quantile = 0.99`` quantile and renormalised to
  sum 1, which removes attention sinks (the first token takes a large share of every row in small
  models) without reordering the remaining tokens.

The proxy's rows are memoised per loaded model, keyed on the window's token ids, the sampled row
positions and the layers (the last ``MEMO_ENTRIES`` windows of the process): ReCAP variants that
serve the same context (``recap``, ``recap-line`` and ``recap-paragraph`` measure a turn over the
same served messages; a replay or a test runs them side by side, each with its own policy
instance) run one forward pass for it instead of one each. The rows are the same arrays, read-only.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from historygraph.history.events import Message


@dataclass
class TokenAttention:
    """Sampled attention rows over one served context.

    Attributes:
        spans: ``[(start, end)]`` token range of each served message (end exclusive), in the
            source's own tokenization; consecutive and in message order.
        offset: token position of column 0 of ``rows`` (tokens before it are outside the window).
        rows: float array ``[R, T]``: attention of ``R`` sampled query tokens over the ``T`` window
            tokens, averaged over heads and the importance layers; each row is non-negative.
        row_pos: int array ``[R]``: absolute token position of each row's query token.
        edge_rows: ``[R, T]`` at the dependency layer, or ``None`` to use ``rows``.

    Raises:
        ValueError: on inconsistent shapes or positions (from :meth:`validate`).
    """

    spans: list[tuple[int, int]]
    offset: int
    rows: np.ndarray
    row_pos: np.ndarray
    edge_rows: np.ndarray | None = None

    def validate(self) -> None:
        n_tok = self.spans[-1][1] if self.spans else 0
        if self.rows.ndim != 2 or self.rows.shape[0] != len(self.row_pos):
            raise ValueError(f"rows must be [R, T] with R = len(row_pos) = {len(self.row_pos)}, got {self.rows.shape}")
        if self.offset + self.rows.shape[1] != n_tok:
            raise ValueError(f"window [{self.offset}, {self.offset + self.rows.shape[1]}) must end at the last token {n_tok}")
        if len(self.row_pos) and (self.row_pos.min() < self.offset or self.row_pos.max() >= n_tok):
            raise ValueError("row_pos must lie inside the window")
        if self.edge_rows is not None and self.edge_rows.shape != self.rows.shape:
            raise ValueError(f"edge_rows shape {self.edge_rows.shape} != rows shape {self.rows.shape}")
        if (self.rows < 0).any():
            raise ValueError("attention rows must be non-negative")


class AttentionSource(Protocol):
    """Supplies attention over a served context.

    ``attend(messages, turn_start)`` returns rows sampled from the tokens of
    ``messages[turn_start:]`` (the completed turn) over the whole served context.
    """

    name: str

    def attend(self, messages: Sequence[Message], turn_start: int) -> TokenAttention: ...


class CallerAttention:
    """Attention supplied by the caller (a serving engine exposing attention rows).

    ``fn(messages, turn_start)`` must return a :class:`TokenAttention` over ``messages``; it is
    validated before use (ValueError on inconsistent shapes).
    """

    name = "caller"

    def __init__(self, fn: Callable[[Sequence[Message], int], TokenAttention]) -> None:
        self.fn = fn

    def attend(self, messages: Sequence[Message], turn_start: int) -> TokenAttention:
        ta = self.fn(messages, turn_start)
        ta.validate()
        return ta


def serialize(message: Message) -> str:
    """The text a proxy reads for one message: ChatML framing, content, then each call as ``name(arguments)``."""
    calls = "".join(f"\n{c.name}({c.arguments})" for c in message.tool_calls)
    return f"<|im_start|>{message.role}\n{message.content}{calls}<|im_end|>\n"


class ProxyAttention:
    """SmolLM2-135M-Instruct as the attention proxy (defaults in the module docstring).

    Raises:
        historygraph.models.smollm2.ModelUnavailableError: when torch/transformers or the model
            package is missing (on first :meth:`attend`).
    """

    name = "smollm2"

    def __init__(self, window_tokens: int = 512, sample_rows: int = 32, layers: tuple[int, ...] = (6, 12, 18, 24),
                 edge_layer: int = 15, loader: Callable[[], tuple[Any, Any]] | None = None) -> None:
        if not 16 <= window_tokens <= 8192:
            raise ValueError(f"window_tokens must be in [16, 8192] (the proxy's context), got {window_tokens}")
        self.window_tokens, self.sample_rows, self.layers, self.edge_layer = window_tokens, sample_rows, layers, edge_layer
        self._loader = loader

    def _model(self) -> tuple[Any, Any]:
        if self._loader is None:
            from historygraph.models.smollm2 import load_smollm2
            self._loader = load_smollm2
        return self._loader()

    def tokenize(self, messages: Sequence[Message]) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of the serialized messages that reach into the window, and every message's span.

        Messages are tokenized from the last one backwards until ``window_tokens`` are covered;
        earlier messages get empty spans at position 0 (they lie before the window)."""
        _, tok = self._model()
        pieces: list[list[int]] = []
        total = 0
        for m in reversed(messages):
            if total >= self.window_tokens:
                break
            pieces.append(tok(serialize(m), add_special_tokens=False)["input_ids"])
            total += len(pieces[-1])
        pieces = [[] for _ in range(len(messages) - len(pieces))] + pieces[::-1]
        ids: list[int] = []
        spans = []
        for piece in pieces:
            spans.append((len(ids), len(ids) + len(piece)))
            ids.extend(piece)
        return ids, spans

    def attend(self, messages: Sequence[Message], turn_start: int) -> TokenAttention:
        """Rows for ``messages[turn_start:]`` over the last ``window_tokens`` tokens.

        The rows are computed from each selected layer's queries and keys (captured by a hook on its
        attention module, rotary embedding applied) exactly as eager attention does, but only for
        the sampled rows; the forward pass stops after the last selected layer. A window this
        process already attended with the same model, rows and layers comes from the memo (module
        docstring) without a forward pass.
        """
        import torch
        from transformers.models.llama.modeling_llama import repeat_kv, rotate_half

        model, _ = self._model()
        ids, spans = self.tokenize(messages)
        end = len(ids)
        offset = max(0, end - self.window_tokens)
        first = max(offset, min(spans[turn_start][0], end - 1) if turn_start < len(spans) else end - 1)
        pos = set(np.linspace(first, end - 1, num=min(self.sample_rows, end - first)).round().astype(int).tolist())
        pos |= {e - 1 for s, e in spans[turn_start:] if e - 1 >= first}
        row_pos = np.array(sorted(pos), dtype=int)
        wanted = sorted(set(self.layers) | {self.edge_layer})
        key = (tuple(ids[offset:end]), tuple((row_pos - offset).tolist()), tuple(self.layers), self.edge_layer)
        memo = _memo_get(model, key)
        if memo is not None:
            return TokenAttention(spans, offset, memo[0], row_pos, memo[1])
        local = torch.as_tensor(row_pos - offset)
        got: dict[int, Any] = {}

        def hook(module: Any, args: tuple, kwargs: dict) -> None:
            h = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            cos, sin = kwargs["position_embeddings"]
            d = module.head_dim
            q = module.q_proj(h[:, local]).view(1, len(local), -1, d).transpose(1, 2)
            k = module.k_proj(h).view(1, h.shape[1], -1, d).transpose(1, 2)
            cq, sq = cos[:, local].unsqueeze(1), sin[:, local].unsqueeze(1)
            q = q * cq + rotate_half(q) * sq
            k = k * cos.unsqueeze(1) + rotate_half(k) * sin.unsqueeze(1)
            scores = (q @ repeat_kv(k, module.num_key_value_groups).transpose(2, 3)) * module.scaling
            future = torch.arange(h.shape[1])[None, :] > local[:, None]
            got[module.layer_idx] = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1, dtype=torch.float32)[0]
            if module.layer_idx == wanted[-1]:
                raise _Enough

        layers = model.model.layers
        handles = [layers[i].self_attn.register_forward_pre_hook(hook, with_kwargs=True) for i in wanted]
        try:
            with torch.no_grad():
                model(torch.tensor([ids[offset:end]]), use_cache=False)
        except _Enough:
            pass
        finally:
            for handle in handles:
                handle.remove()
        rows = torch.stack([got[i].mean(0) for i in self.layers]).mean(0).numpy()
        edge = got[self.edge_layer].mean(0).numpy()
        _memo_put(model, key, (rows, edge))
        return TokenAttention(spans, offset, rows, row_pos, edge)


MEMO_ENTRIES = 32  # windows of rows kept per model: 2 float32 [R, T] arrays each, ≤ ~0.3 MB at the defaults
_memo: weakref.WeakKeyDictionary[Any, OrderedDict[tuple, tuple[np.ndarray, np.ndarray]]] = weakref.WeakKeyDictionary()
_memo_lock = threading.Lock()


def _memo_get(model: Any, key: tuple) -> tuple[np.ndarray, np.ndarray] | None:
    with _memo_lock:
        memo = _memo.get(model)
        got = memo.get(key) if memo is not None else None
        if got is not None:
            _memo[model].move_to_end(key)
        return got


def _memo_put(model: Any, key: tuple, value: tuple[np.ndarray, np.ndarray]) -> None:
    for a in value:
        a.setflags(write=False)
    with _memo_lock:
        entries = _memo.setdefault(model, OrderedDict())
        entries[key] = value
        while len(entries) > MEMO_ENTRIES:
            entries.popitem(last=False)


class _Enough(Exception):
    """Stops the proxy's forward pass once the last selected layer's rows are captured."""


@dataclass
class MessageAttention:
    """Per-message reduction of clipped attention (what the graph update needs; JSON-cacheable).

    Attributes:
        rho_sum: ``[M]`` Σ of ρ(j) over each message's tokens inside the window, where ρ(j) is the
            mean clipped attention that token ``j`` receives from the sampled rows at or after it.
        n_tokens: ``[M]`` tokens of each message inside the window (0: not observed).
        row_message: ``[R]`` index of the message holding each row's query token.
        row_mass: ``[R, M]`` clipped edge-layer attention mass each row puts on each message.
    """

    rho_sum: list[float]
    n_tokens: list[int]
    row_message: list[int]
    row_mass: list[list[float]]

    def to_json(self) -> dict[str, Any]:
        return {"rho_sum": self.rho_sum, "n_tokens": self.n_tokens, "row_message": self.row_message,
                "row_mass": self.row_mass}


def clip_rows(rows: np.ndarray, quantile: float) -> np.ndarray:
    """Clip each row at its ``quantile`` value and renormalise it to sum 1 (zero rows stay zero)."""
    if rows.size == 0:
        return rows
    cap = np.quantile(rows, quantile, axis=1, keepdims=True)
    out = np.minimum(rows, cap)
    total = out.sum(axis=1, keepdims=True)
    return np.divide(out, total, out=np.zeros_like(out), where=total > 0)


def consolidate(ta: TokenAttention, clip_quantile: float = 0.99) -> MessageAttention:
    """Clip ``ta`` and reduce it to per-message figures (see :class:`MessageAttention`)."""
    ta.validate()
    rows = clip_rows(ta.rows.astype(np.float64), clip_quantile)
    edge = rows if ta.edge_rows is None else clip_rows(ta.edge_rows.astype(np.float64), clip_quantile)
    T = rows.shape[1]
    cols = np.arange(T) + ta.offset
    sees = ta.row_pos[:, None] >= cols[None, :]  # [R, T]: row i can attend token j
    n_seen = sees.sum(axis=0)
    rho = np.divide((rows * sees).sum(axis=0), n_seen, out=np.zeros(T), where=n_seen > 0)
    starts = np.array([s for s, _ in ta.spans])
    rho_sum, n_tokens, mass = [], [], []
    for s, e in ta.spans:
        a, b = max(s, ta.offset) - ta.offset, max(e, ta.offset) - ta.offset
        rho_sum.append(float(rho[a:b].sum()))
        n_tokens.append(int(b - a))
        mass.append(edge[:, a:b].sum(axis=1))
    row_message = (np.searchsorted(starts, ta.row_pos, side="right") - 1).tolist()
    row_mass = np.stack(mass, axis=1) if mass else np.zeros((len(ta.row_pos), 0))
    return MessageAttention(rho_sum, n_tokens, row_message, row_mass.round(6).tolist())
