"""One small chat-model client for summaries and analyses, with usage accounting.

Two implementations of :class:`ChatModel`:

* :class:`OpenAICompatibleModel`: any OpenAI-compatible ``/chat/completions`` endpoint (httpx),
  configured by base URL, model and API key; 429, 5xx and connection errors are retried with
  exponential backoff (``tenacity``), so one rate limit does not end a long replay.
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


class _Retryable(Exception):
    """A 429 or 5xx answer: worth another try (carries the response for Retry-After)."""

    def __init__(self, response: Any) -> None:
        super().__init__(f"{response.status_code}: {response.text[:300]}")
        self.response = response


def _retry_after(exc: BaseException | None) -> float | None:
    """Seconds from a ``Retry-After`` header given in seconds (RFC 9110 §10.2.3), else ``None``."""
    if isinstance(exc, _Retryable):
        value = exc.response.headers.get("retry-after", "")
        try:
            return max(0.0, float(value))
        except ValueError:
            return None
    return None


class OpenAICompatibleModel:
    """Args: base_url (e.g. ``http://127.0.0.1:8000/v1``), model, api_key (optional),
    timeout in seconds, transport (an ``httpx`` transport, for tests), retries, backoff.

    Retries: a 429, a 5xx or a connection/transport error is retried up to ``retries`` times
    (``tenacity``), waiting ``backoff · 2^k`` seconds with random jitter (at most 60 s) before try
    ``k + 1``, or the ``Retry-After`` seconds the server gives (capped at 60 s). Other statuses (400,
    401, 404 …) fail at once. ``backoff = 0`` retries without waiting.

    Raises (from :meth:`complete`):
        ModelError: the last error after every try, naming the endpoint, status and tries.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout: float = 120.0,
                 transport: Any = None, retries: int = 5, backoff: float = 1.0) -> None:
        import httpx

        if retries < 0 or backoff < 0:
            raise ValueError(f"retries and backoff must be >= 0, got {retries} and {backoff}")
        self.name = model
        self.retries = retries
        self.backoff = backoff
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, transport=transport)

    def _wait(self, state: Any) -> float:
        """Seconds before the next try: the server's Retry-After, else jittered exponential backoff."""
        from tenacity import wait_exponential_jitter

        hinted = _retry_after(state.outcome.exception() if state.outcome else None)
        if hinted is not None:
            return min(hinted, 60.0)
        if self.backoff == 0:
            return 0.0
        return wait_exponential_jitter(initial=self.backoff, max=60.0, jitter=self.backoff)(state)

    def _post(self, body: dict[str, Any]) -> Any:
        import httpx
        from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt

        retrying = Retrying(stop=stop_after_attempt(self.retries + 1), wait=self._wait, reraise=False,
                            retry=retry_if_exception_type((httpx.TransportError, _Retryable)))
        try:
            for attempt in retrying:
                with attempt:
                    r = self._client.post("/chat/completions", json=body)
                    if r.status_code == 429 or r.status_code >= 500:
                        raise _Retryable(r)
                    return r
        except RetryError as exc:
            last = exc.last_attempt.exception()
            tries = exc.last_attempt.attempt_number
            if isinstance(last, _Retryable):
                raise ModelError(f"model endpoint {self._client.base_url} answered {last} "
                                 f"({tries} tries)") from last
            raise ModelError(f"model endpoint {self._client.base_url} unreachable after {tries} tries: {last}") from last
        except httpx.HTTPError as exc:  # not retried (e.g. an invalid URL)
            raise ModelError(f"model endpoint {self._client.base_url} unreachable: {exc}") from exc

    def complete(self, messages: list[dict[str, str]], max_tokens: int = 256) -> Completion:
        t0 = time.perf_counter()
        r = self._post({"model": self.name, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
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
        from historygraph.models.smollm2 import ModelUnavailableError, load_smollm2

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


def endpoint_config() -> dict[str, Any] | None:
    """The configured endpoint (``base_url``, ``model``, ``api_key``, optional ``retries``) or ``None``.
    ``HISTORYGRAPH_LLM_RETRIES`` (or ``retries`` in the ``[llm]`` table) sets the retries of
    :class:`OpenAICompatibleModel` (default 5)."""
    env = {k: os.environ.get(f"HISTORYGRAPH_LLM_{k.upper()}") for k in ("base_url", "model", "api_key", "retries")}
    if env["base_url"]:
        if not env["model"]:
            raise ModelError("HISTORYGRAPH_LLM_BASE_URL is set but HISTORYGRAPH_LLM_MODEL is not")
        out: dict[str, Any] = {k: v for k, v in env.items() if v and k != "retries"}
        if env["retries"]:
            out["retries"] = _retries(env["retries"], "HISTORYGRAPH_LLM_RETRIES")
        return out
    path = Path(platformdirs.user_config_dir("historygraph")) / "historygraph.toml"
    if path.is_file():
        try:
            cfg = tomllib.loads(path.read_text()).get("llm") or {}
        except tomllib.TOMLDecodeError as exc:
            raise ModelError(f"{path}: invalid TOML: {exc}") from exc
        if cfg.get("base_url"):
            if not cfg.get("model"):
                raise ModelError(f"{path}: [llm] base_url is set but model is not")
            out = {k: str(v) for k, v in cfg.items() if k in ("base_url", "model", "api_key")}
            if "retries" in cfg:
                out["retries"] = _retries(cfg["retries"], f"{path}: [llm] retries")
            return out
    return None


def _retries(value: Any, where: str) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = -1
    if n < 0:
        raise ModelError(f"{where} must be a whole number >= 0, got {value!r}")
    return n


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
