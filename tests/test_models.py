"""The local SmolLM2 model loads offline from its PyPI package and generates text."""

import pytest

pytestmark = pytest.mark.lm


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
