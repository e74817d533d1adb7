"""The local SmolLM2 model loads offline from its PyPI package and generates text; its float32
copy is written whole or not at all."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from historygraph.models import smollm2


@pytest.mark.lm
def test_smollm2_loads_offline_with_eager_attention():
    # imported here, not at module level: every test process collects this file, and importing
    # torch costs about 2 CPU s (docs/tests.md)
    torch = pytest.importorskip("torch", reason="the 'llm' extra is not installed")
    from historygraph.models.smollm2 import load_smollm2

    model, tok = load_smollm2()
    assert (model.config.num_hidden_layers, model.config.num_attention_heads) == (30, 9)
    assert model.config._attn_implementation == "eager"
    enc = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France? One word."}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0][enc["input_ids"].shape[1]:], skip_special_tokens=True)


class _Saves:
    """Stands in for a transformers model or tokenizer class: ``from_pretrained`` returns an object
    whose ``save_pretrained`` writes ``name`` into the folder (or raises, to cut a conversion short)."""

    def __init__(self, name, fail=False):
        self.name, self.fail = name, fail

    def from_pretrained(self, *args, **kwargs):
        return self

    def save_pretrained(self, folder):
        if self.fail:
            raise OSError("disk full")
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / self.name).write_text("weights")


def test_a_conversion_replaces_an_incomplete_copy_and_leaves_no_temporary_folder(tmp_path):
    saved = tmp_path / "SmolLM2-135M-Instruct-f32"
    saved.mkdir()
    (saved / "model.safetensors").write_text("half")  # a copy without its tokenizer
    assert not smollm2._converted(saved)
    smollm2._convert(tmp_path / "m.gguf", saved, SimpleNamespace(float32="float32"), _Saves("model.safetensors"), _Saves("tokenizer.json"),
                     lambda **kw: None)
    assert smollm2._converted(saved) and (saved / "model.safetensors").read_text() == "weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["SmolLM2-135M-Instruct-f32"]


def test_a_failed_conversion_leaves_neither_a_copy_nor_a_temporary_folder(tmp_path):
    saved = tmp_path / "SmolLM2-135M-Instruct-f32"
    with pytest.raises(OSError, match="disk full"):
        smollm2._convert(tmp_path / "m.gguf", saved, SimpleNamespace(float32="float32"), _Saves("model.safetensors"), _Saves("tokenizer.json", fail=True),
                         lambda **kw: None)
    assert list(tmp_path.iterdir()) == []
