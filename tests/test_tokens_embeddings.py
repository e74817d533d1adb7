"""Real tokenizer tables and the real embedding model, offline."""

import numpy as np
import pytest

from historygraph.history.events import Message, ToolCall
from historygraph.signals.embeddings import (CachedEmbedder, MiniLMEmbedder, StaticEmbedder, WordLlamaEmbedder,
                                             default_embedder)
from historygraph.signals.tokens import MESSAGE_OVERHEAD, TokenCounter, get_encoding
from historygraph.store import SQLiteStore


def test_known_token_ids():
    # ids published in ../shared/OFFLINE.md, measured with OpenAI's own tiktoken
    assert get_encoding("cl100k_base").encode("hello world") == [15339, 1917]
    assert get_encoding("o200k_base").encode("hello world") == [24912, 2375]


def test_unknown_encoding_is_named():
    with pytest.raises(ValueError, match="p50k"):
        get_encoding("p50k_base")


def test_message_count_includes_calls_and_overhead():
    c = TokenCounter()
    m = Message("assistant", "hello world", (ToolCall("c1", "bash", '{"command": "ls"}'),))
    assert c.count_message(m) == MESSAGE_OVERHEAD + 2 + c.count("bash") + c.count('{"command": "ls"}')


@pytest.fixture(scope="module")
def embedder():
    return MiniLMEmbedder()


def test_minilm_is_a_real_sentence_model(embedder):
    v = embedder.embed(["A man is eating food.", "A man is eating a piece of bread.", "The stock market crashed today."])
    assert v.shape == (3, 384)
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    assert v[0] @ v[1] > 0.6 > 0.2 > v[0] @ v[2]


def test_each_text_embedded_once_per_store(tmp_path, embedder):
    store = SQLiteStore(tmp_path / "s.sqlite")
    first = CachedEmbedder(embedder, store)
    a = first.embed(["alpha text", "beta text", "alpha text"])
    assert first.calls == 2
    store.close()
    store = SQLiteStore(tmp_path / "s.sqlite")
    second = CachedEmbedder(embedder, store)  # a new process would start like this
    b = second.embed(["beta text", "alpha text"])
    assert second.calls == 0
    assert np.allclose(a[1], b[0]) and np.allclose(a[0], b[1])


def test_cached_embedder_memoises_content_keys_and_stays_bounded():
    """The per-text memo of cache keys gives exactly ``content_key`` (sha256 of model NUL text,
    the persistent cache's key) and is cleared when full, never grows without bound."""
    import hashlib

    class Unit:
        model, dim = "unit", 2

        def embed(self, texts):
            return np.ones((len(texts), 2), dtype=np.float32)

    emb = CachedEmbedder(Unit())
    emb.key_memo_size = 3
    for t in ["a", "b", "a", "c", "d", "ü"]:
        assert emb.key(t) == hashlib.sha256(f"unit\0{t}".encode()).hexdigest()
        assert len(emb._keys) <= 3
    assert emb.embed(["a", "b", "a"]).shape == (3, 2) and emb.calls == 2


def test_the_memo_is_one_block_of_rows_in_request_order(tmp_path):
    """The memo's rows (one float32 block) come back in the order asked, repeats included, from
    the model or the persistent cache alike; ``rows`` answers only when it holds every key, and a
    vector of another width is refused."""

    class Len:
        model, dim = "len", 2

        def __init__(self, width=2):
            self.width = width

        def embed(self, texts):
            return np.array([[len(t)] + [1.0] * (self.width - 1) for t in texts], dtype=np.float64)

    store = SQLiteStore(tmp_path / "e.sqlite")
    emb = CachedEmbedder(Len(), store)
    texts = ["ab", "abcd", "ab", "x" * 100]  # 70 distinct texts in all, more than the first block's 64 rows
    assert emb.embed(texts).tolist() == [[2, 1], [4, 1], [2, 1], [100, 1]] and emb.calls == 3
    many = [str(i) * 3 for i in range(67)]
    v = emb.embed(many + texts)
    assert v.dtype == np.float32 and v[:, 0].tolist() == [len(t) for t in many + texts] and emb.calls == 70
    rows = emb.rows([emb.key("ab"), emb.key("x" * 100)])
    assert emb.vectors(rows).tolist() == [[2, 1], [100, 1]] and rows == emb.hold(["ab", "x" * 100])
    assert emb.rows([emb.key("ab"), emb.key("new")]) is None and emb.calls == 70
    again = CachedEmbedder(Len(), store)  # a new process: every vector from the persistent cache
    assert again.embed(texts[::-1]).tolist() == [[100, 1], [2, 1], [4, 1], [2, 1]] and again.calls == 0
    wide = CachedEmbedder(Len(3), store)  # the cache holds width 2; "new" comes back 3 wide
    wide.embed(["ab"])
    with pytest.raises(ValueError, match="width 2"):
        wide.embed(["new"])
    store.close()


def test_truncation_length_and_threads(embedder):
    """The truncation length changes only texts longer than it, and is part of the cache's model
    name; one thread without spin-waiting gives the vectors of the default settings."""
    short, long = "A man is eating food.", " ".join(f"word{i}" for i in range(400))
    at128 = MiniLMEmbedder(max_word_pieces=128, threads=1, spin=True)
    assert embedder.model == "all-MiniLM-L6-v2" and at128.model == "all-MiniLM-L6-v2@128"
    a, b = embedder.embed([short, long]), at128.embed([short, long])
    assert np.allclose(a[0], b[0], atol=1e-5) and not np.allclose(a[1], b[1], atol=1e-3)
    assert np.allclose(MiniLMEmbedder(threads=1).embed([short, long]), a, atol=1e-5)
    with pytest.raises(ValueError, match="max_word_pieces"):
        MiniLMEmbedder(max_word_pieces=1)


@pytest.fixture(scope="module")
def static():
    return StaticEmbedder()


@pytest.mark.parametrize(("fixture", "dim", "model"), [("static", 64, "tokenlearn-static-10k-64d"),
                                                       ("wordllama", 256, "wordllama-l2-supercat-256")])
def test_the_fast_embedders_are_real_sentence_models(request, fixture, dim, model):
    e = request.getfixturevalue(fixture)
    v = e.embed(["A man is eating food.", "A man is eating a piece of bread.", "The stock market crashed today.", ""])
    assert v.shape == (4, dim) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v[:3], axis=1), 1.0, atol=1e-5) and not v[3].any()  # no token: zero vector
    assert v[0] @ v[1] > 0.6 > 0.2 > v[0] @ v[2]
    assert e.model == model
    assert e.embed([]).shape == (0, dim)


def test_minilm_is_the_default_embedder():
    assert isinstance(default_embedder(), MiniLMEmbedder)  # the static package declares no licence (opt-in extra)


def test_static_embedder_gives_the_packages_own_vectors(static, traces_dir):
    """Our numpy pipeline against the package's own Rust encoder (``static_model.get_embeddings``:
    its tokenizer, the first 512 tokens, weighted mean, unit length) on real tool results, short
    and far over 512 tokens, in one batch."""
    from static_model import get_embeddings

    from historygraph.traces import list_trace_files, read_traces

    texts = [m.content for f in list_trace_files(traces_dir)[:6] for t in read_traces(f) for m in t.messages
             if m.role == "tool" and m.content][:120]
    assert len(texts) == 120 and max(map(len, texts)) > 8000
    assert np.abs(static.embed(texts) - np.asarray(get_embeddings(texts), dtype=np.float32)).max() < 1e-5


@pytest.mark.parametrize(("fixture", "cls", "model"), [("static", "StaticEmbedder", "tokenlearn-static-10k-64d"),
                                                       ("wordllama", "WordLlamaEmbedder", "wordllama-l2-supercat-256")])
def test_the_fast_embedders_truncation_is_part_of_the_model_name(request, fixture, cls, model):
    full, embedder = request.getfixturevalue(fixture), {"StaticEmbedder": StaticEmbedder, "WordLlamaEmbedder": WordLlamaEmbedder}[cls]
    short, long = "hi there", " ".join(f"word{i}" for i in range(400))
    at16 = embedder(max_tokens=16)
    assert at16.model == f"{model}@16"
    a, b = full.embed([short, long]), at16.embed([short, long])
    assert np.allclose(a[0], b[0]) and not np.allclose(a[1], b[1], atol=1e-2)
    with pytest.raises(ValueError, match="max_tokens"):
        embedder(max_tokens=0)


def test_the_proxy_embeds_with_the_embedder_it_is_given(static):
    from historygraph.server.config import ServerConfig
    from historygraph.server.proxy import Proxy

    # the proxy's default is WordLlama (recall within 1 point of MiniLM, about 1/40 of its CPU), the replays' MiniLM
    assert isinstance(Proxy(ServerConfig(store=":memory:", policy="prune")).signals.embedder.inner, WordLlamaEmbedder)
    assert isinstance(Proxy(ServerConfig(store=":memory:", policy="prune", embedder="minilm")).signals.embedder.inner,
                      MiniLMEmbedder)
    assert isinstance(Proxy(ServerConfig(store=":memory:", policy="prune", embedder="static")).signals.embedder.inner,
                      StaticEmbedder)
    assert isinstance(Proxy(ServerConfig(store=":memory:", policy="prune", embedder="wordllama")).signals.embedder.inner,
                      WordLlamaEmbedder)
    with pytest.raises(ValueError, match="unknown embedder 'nope'; choose one of static, minilm, wordllama"):
        ServerConfig(store=":memory:", embedder="nope")


@pytest.fixture(scope="module")
def wordllama():
    return WordLlamaEmbedder()


def test_wordllama_embedder_gives_the_packages_own_vectors(wordllama, traces_dir):
    """Our numpy pipeline against the package's own inference (``WordLlamaInference.embed(texts,
    norm=True)``: its tokenizer, every token, mean, unit length) on the wheel's own files, on real
    tool results short and long, in one batch. (The package's ``WordLlama.load`` looks for the
    tokenizer under ``tokenizer/`` while the wheel has it under ``tokenizers/``, so it would
    download it; the files are opened here directly.)"""
    import importlib.util
    import os

    from safetensors.numpy import load_file
    from tokenizers import Tokenizer
    from wordllama.inference import WordLlamaInference

    from historygraph.traces import list_trace_files, read_traces

    spec = importlib.util.find_spec("wordllama")
    assert spec is not None and spec.submodule_search_locations
    base = list(spec.submodule_search_locations)[0]
    ref = WordLlamaInference(load_file(os.path.join(base, "weights", "l2_supercat_256.safetensors"))["embedding.weight"],
                             Tokenizer.from_file(os.path.join(base, "tokenizers", "l2_supercat_tokenizer_config.json")))
    texts = [m.content for f in list_trace_files(traces_dir)[:6] for t in read_traces(f) for m in t.messages
             if m.role == "tool" and m.content][:60]
    assert len(texts) == 60 and max(map(len, texts)) > 8000
    assert np.abs(wordllama.embed(texts) - ref.embed(texts, norm=True, batch_size=8)).max() < 1e-5


class _SlowUnit:
    """A deterministic embedder that takes a while per call and records every batch it gets."""

    model, dim = "slow-unit", 2

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def embed(self, texts):
        import time

        self.batches.append(list(texts))
        time.sleep(0.05)  # long enough for the other threads to arrive while it runs
        return np.array([[len(t), 1.0] for t in texts], dtype=np.float32)


def _at_once(n, fn):
    import threading

    start = threading.Barrier(n)
    out = [None] * n

    def run(i):
        start.wait()
        out[i] = fn()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_concurrent_calls_embed_each_text_once():
    # the proxy's worker threads asking for the same new results at once: one model call embeds
    # them, the others wait and reuse its vectors (before: every thread embedded every text)
    inner = _SlowUnit()
    emb = CachedEmbedder(inner)
    texts = ["alpha", "beta gamma", "delta"]
    out = _at_once(8, lambda: emb.embed(texts))
    assert sorted(t for b in inner.batches for t in b) == sorted(texts) and emb.calls == 3
    assert all(np.array_equal(o, [[5, 1], [10, 1], [5, 1]]) for o in out)


def test_signals_build_the_embedder_once_when_first_asked_concurrently():
    from historygraph.policies import Signals

    built = []

    def factory():
        import time

        built.append(1)
        time.sleep(0.05)
        return _SlowUnit()

    signals = Signals(embedder_factory=factory)
    got = _at_once(8, lambda: signals.embedder)
    assert len(built) == 1 and all(g is got[0] for g in got)
