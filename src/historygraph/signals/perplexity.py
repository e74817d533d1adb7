"""Token-level surprisal from a small causal language model: the signal of the prompt compressors.

LLMLingua (Jiang et al., EMNLP 2023, arXiv:2310.05736), LongLLMLingua (Jiang et al., 2024,
arXiv:2310.06839) and Selective Context (Li et al., EMNLP 2023, arXiv:2310.06201) all score text
by a small causal model's negative log-likelihood of each token given what precedes it. One
interface, :class:`TokenScorer`:

* ``tokenize(text)`` splits ``text`` into the scorer's tokens as character spans (no model call);
* ``score(text, context)`` returns the NLL (nats) of every token of ``text`` given ``context``
  and the tokens of ``text`` before it, with the cost of the forward pass (tokens read, seconds).

:class:`SmolLM2Scorer` is the implementation shipped here: SmolLM2-135M-Instruct on the CPU
(:func:`historygraph.models.smollm2.load_smollm2`), a much smaller model than the papers' compressors
(LLaMA-2-7B for LLMLingua/LongLLMLingua, GPT-2 / LLaMA for Selective Context). Text and context are
joined after the beginning-of-sequence token, and one forward pass scores them; the caller bounds
their length (the policies of :mod:`historygraph.policies.baselines.lingua` cap both), and inputs longer than
``max_tokens`` (default 1,024 model tokens) keep the tail of the context first and then the head of
the text, so a forward pass never exceeds it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np


@dataclass(frozen=True)
class Scored:
    """The scores of one text.

    Attributes:
        spans: ``[(start, end)]`` character range of each scored token of the text, in order.
        nll: float array ``[len(spans)]``: −log p(token | context, earlier tokens), in nats.
        input_tokens: tokens the model read for it (context + text), for the cost figures.
        seconds: wall time of the forward pass.
    """

    spans: list[tuple[int, int]]
    nll: np.ndarray
    input_tokens: int
    seconds: float


class TokenScorer(Protocol):
    """A causal model's token surprisal (module docstring). ``name`` identifies the model in cache keys."""

    name: str

    def tokenize(self, text: str) -> list[tuple[int, int]]: ...

    def score(self, text: str, context: str = "") -> Scored: ...


class SmolLM2Scorer:
    """SmolLM2-135M-Instruct's token NLL on the CPU (module docstring).

    ``threads`` (or ``$HISTORYGRAPH_LLM_THREADS``) sets torch's CPU threads, as for
    :class:`~historygraph.models.chat.LocalSmolLM2`. ``loader`` replaces the model loader (tests).

    Raises:
        historygraph.models.chat.ModelError: torch/transformers or the model package is missing (on first use).
    """

    name = "SmolLM2-135M-Instruct"

    def __init__(self, max_tokens: int = 1024, threads: int | None = None,
                 loader: Callable[[], tuple[Any, Any]] | None = None) -> None:
        if max_tokens < 8:
            raise ValueError(f"max_tokens must be >= 8, got {max_tokens}")
        self.max_tokens, self._threads, self._loader = max_tokens, threads, loader
        self._lock = threading.Lock()
        self._loaded: tuple[Any, Any] | None = None

    def _model(self) -> tuple[Any, Any]:
        if self._loaded is None:
            from historygraph.models.chat import ModelError
            from historygraph.models import smollm2

            threads = self._threads or int(os.environ.get("HISTORYGRAPH_LLM_THREADS", "0") or 0)
            try:
                if threads:
                    import torch

                    torch.set_num_threads(threads)
                self._loaded = (self._loader or smollm2.load_smollm2)()
            except (smollm2.ModelUnavailableError, ImportError) as exc:
                raise ModelError(str(exc)) from exc
        return self._loaded

    def _encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        _, tok = self._model()
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [(int(a), int(b)) for a, b in enc["offset_mapping"]]

    def tokenize(self, text: str) -> list[tuple[int, int]]:
        return self._encode(text)[1] if text else []

    def score(self, text: str, context: str = "") -> Scored:
        import torch

        model, tok = self._model()
        ids, spans = self._encode(text) if text else ([], [])
        ctx = self._encode(context)[0] if context else []
        room = self.max_tokens - 1
        ids, spans = ids[:room], spans[:room]
        ctx = ctx[max(0, len(ctx) - (room - len(ids))):] if room > len(ids) else []
        if not ids:
            return Scored([], np.zeros(0), 0, 0.0)
        bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        seq = [bos] + ctx + ids
        t0 = time.perf_counter()
        with self._lock, torch.no_grad():
            logits = model(torch.tensor([seq]), use_cache=False).logits[0, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits, torch.tensor(seq[1:]), reduction="none")
        out = nll[len(ctx):].numpy().astype(np.float64)
        return Scored(spans, out, len(seq), time.perf_counter() - t0)


def default_scorer() -> TokenScorer:
    """The shared SmolLM2 scorer of the process (the model loads on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = SmolLM2Scorer()
        return _default


_default: TokenScorer | None = None
_default_lock = threading.Lock()
