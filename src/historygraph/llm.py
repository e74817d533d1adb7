"""One small chat-model client for summaries and analyses, with usage accounting.

Two implementations of :class:`ChatModel`:

* :class:`OpenAICompatibleModel`: any OpenAI-compatible ``/chat/completions`` endpoint (httpx),
  configured by base URL, model and API key.
* :class:`LocalSmolLM2`: SmolLM2-135M-Instruct on the CPU (:mod:`historygraph.models.smollm2`),
  the offline default. Its summaries are weak but real.

:func:`default_model` picks the endpoint when one is configured (environment variables
``HISTORYGRAPH_LLM_BASE_URL``, ``HISTORYGRAPH_LLM_MODEL``, ``HISTORYGRAPH_LLM_API_KEY``, or the
``[llm]`` table of ``historygraph.toml`` in the user config directory), else the local model.

Every call returns a :class:`Completion` with its input and output tokens (the provider's
``usage`` when it reports one, else counted with the model's tokenizer) and wall time, so that
evaluator cost figures include summariser calls (ContextRender C.2). :class:`ModelUsage` sums them.
"""

from __future__ import annotations

import os
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import platformdirs


class ModelError(RuntimeError):
    """A model call failed or the model cannot be loaded (the message says what to fix)."""


@dataclass(frozen=True)
class Completion:
    text: str
    input_tokens: int
    output_tokens: int
    seconds: float


@dataclass
class ModelUsage:
    """Summed model calls of a policy or run: count, tokens in/out, seconds spent waiting."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0

    def add(self, c: Completion) -> None:
        self.calls += 1
        self.input_tokens += c.input_tokens
        self.output_tokens += c.output_tokens
        self.seconds += c.seconds

    def merge(self, other: "ModelUsage") -> None:
        self.calls += other.calls
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.seconds += other.seconds


class ChatModel(Protocol):
    """``complete(messages, max_tokens)`` with OpenAI-form ``messages`` (role/content dicts)."""

    name: str

    def complete(self, messages: list[dict[str, str]], max_tokens: int = 256) -> Completion: ...


class OpenAICompatibleModel:
    """Args: base_url (e.g. ``http://127.0.0.1:8000/v1``), model, api_key (optional),
    timeout in seconds, transport (an ``httpx`` transport, for tests)."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout: float = 120.0,
                 transport: Any = None) -> None:
        import httpx

        self.name = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, transport=transport)

    def complete(self, messages: list[dict[str, str]], max_tokens: int = 256) -> Completion:
        import httpx

        t0 = time.perf_counter()
        try:
            r = self._client.post("/chat/completions", json={"model": self.name, "messages": messages,
                                                              "max_tokens": max_tokens, "temperature": 0})
        except httpx.HTTPError as exc:
            raise ModelError(f"model endpoint {self._client.base_url} unreachable: {exc}") from exc
        if r.status_code != 200:
            raise ModelError(f"model endpoint {self._client.base_url} answered {r.status_code}: {r.text[:300]}")
        data = r.json()
        try:
            text = data["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError) as exc:
            raise ModelError(f"model endpoint returned no choices[0].message.content: {str(data)[:300]}") from exc
        usage = data.get("usage") or {}
        return Completion(text, int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)),
                          time.perf_counter() - t0)


class LocalSmolLM2:
    """SmolLM2-135M-Instruct on the CPU, greedy decoding. Prompts longer than ``max_input_tokens``
    keep their first message (instructions) and the tail of the rest (documented truncation).
    ``threads`` (or ``$HISTORYGRAPH_LLM_THREADS``) sets torch's CPU threads for the process; unset
    keeps torch's default.

    Raises:
        ModelError: torch/transformers or the model package is missing.
    """

    name = "SmolLM2-135M-Instruct (local)"

    def __init__(self, max_input_tokens: int = 4096, threads: int | None = None) -> None:
        from .models.smollm2 import ModelUnavailableError, load_smollm2

        threads = threads or int(os.environ.get("HISTORYGRAPH_LLM_THREADS", "0") or 0)
        if threads:  # on a shared, busy CPU one thread can be several times faster than torch's default
            import torch

            torch.set_num_threads(threads)

        try:
            self._model, self._tok = load_smollm2()
        except ModelUnavailableError as exc:
            raise ModelError(str(exc)) from exc
        self.max_input_tokens = max_input_tokens
        self._lock = threading.Lock()

    def complete(self, messages: list[dict[str, str]], max_tokens: int = 256) -> Completion:
        import torch

        t0 = time.perf_counter()
        ids = self._tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)["input_ids"]
        if ids.shape[1] > self.max_input_tokens:
            head = self._tok.apply_chat_template(messages[:1], return_tensors="pt", return_dict=True)["input_ids"]
            keep = self.max_input_tokens - head.shape[1]
            ids = torch.cat([head, ids[:, -keep:]], dim=1) if keep > 0 else ids[:, -self.max_input_tokens:]
        with self._lock, torch.no_grad():
            out = self._model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                       do_sample=False, pad_token_id=self._tok.eos_token_id)
        new = out[0][ids.shape[1]:]
        return Completion(self._tok.decode(new, skip_special_tokens=True).strip(), int(ids.shape[1]), int(new.shape[0]),
                          time.perf_counter() - t0)


def endpoint_config() -> dict[str, str] | None:
    """The configured endpoint (``base_url``, ``model``, ``api_key``) or ``None``."""
    env = {k: os.environ.get(f"HISTORYGRAPH_LLM_{k.upper()}") for k in ("base_url", "model", "api_key")}
    if env["base_url"]:
        if not env["model"]:
            raise ModelError("HISTORYGRAPH_LLM_BASE_URL is set but HISTORYGRAPH_LLM_MODEL is not")
        return {k: v for k, v in env.items() if v}
    path = Path(platformdirs.user_config_dir("historygraph")) / "historygraph.toml"
    if path.is_file():
        try:
            cfg = tomllib.loads(path.read_text()).get("llm") or {}
        except tomllib.TOMLDecodeError as exc:
            raise ModelError(f"{path}: invalid TOML: {exc}") from exc
        if cfg.get("base_url"):
            if not cfg.get("model"):
                raise ModelError(f"{path}: [llm] base_url is set but model is not")
            return {k: str(v) for k, v in cfg.items() if k in ("base_url", "model", "api_key")}
    return None


_default: ChatModel | None = None
_default_lock = threading.Lock()


def default_model() -> ChatModel:
    """The configured endpoint, else the shared local SmolLM2 instance (loaded once per process)."""
    global _default
    with _default_lock:
        if _default is None:
            cfg = endpoint_config()
            _default = OpenAICompatibleModel(**cfg) if cfg else LocalSmolLM2()
        return _default
