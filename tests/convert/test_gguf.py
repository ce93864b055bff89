"""GGUF files (llama.cpp) -> TextDecoder + HFTokenizer, on tiny files written here with
``gguf.GGUFWriter``: weights from a random transformers Llama, permuted and quantised as
llama.cpp's converter does, a byte-level BPE trained here with ``tokenizers``.

References: the transformers Llama the file was written from (F32: the un-permutation and
renaming by the maths), transformers' own GGUF loader on the same file (every
quantisation), the block formulas of Q8_0 / Q4_0 / Q4_1 decoded by hand from the bytes,
and the trained ``tokenizers`` tokenizer."""

import json
import shutil

import numpy as np
import pytest
import torch

import multimodal as mm
from multimodal.convert import gguf as mm_gguf

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

Q = gguf.GGMLQuantizationType
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a tiny test model<|im_end|>\n' }}{% endif %}"
          "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CORPUS = ["In the beginning God created the heaven and the earth.",
          "And the earth was without form, and void; and darkness was upon the face of the deep.",
          "The quick brown fox jumps over the lazy dog, 42 times in 1611!",
          "def add(a, b):\n    return a + b  # tabs\tand  spaces",
          "Café, naïve, Zürich: unicode text is bytes too."] * 4


@pytest.fixture(scope="module")
def bpe():
    return byte_level_bpe()


def byte_level_bpe():
    """A byte-level BPE (each digit alone, as SmolLM2's) trained on CORPUS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=320, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def llama(vocab_size, **kw):
    args = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                rms_norm_eps=1e-5, rope_theta=500.0, tie_word_embeddings=True)
    args.update(kw)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**args)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
        model.model.embed_tokens.weight.mul_(30.0)  # peaked logits: no greedy near-ties
    return model


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf ``LlamaModel.permute`` (HF rows -> GGUF rows)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]) \
        .swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, model, tok=None, qtype=Q.F32, arch="llama", tensor_types=None,
               pre="smollm", template=CHATML, tokenizer_model="gpt2"):
    """``model`` (a transformers Llama) and ``tok`` as llama.cpp's converter writes them:
    big matrices as ``qtype``, norms F32, Q/K rows permuted."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", cfg.num_hidden_layers)
    w.add_uint32(f"{arch}.context_length", cfg.max_position_embeddings)
    w.add_uint32(f"{arch}.embedding_length", cfg.hidden_size)
    w.add_uint32(f"{arch}.feed_forward_length", cfg.intermediate_size)
    w.add_uint32(f"{arch}.attention.head_count", cfg.num_attention_heads)
    w.add_uint32(f"{arch}.attention.head_count_kv", cfg.num_key_value_heads)
    w.add_float32(f"{arch}.rope.freq_base", cfg.rope_parameters["rope_theta"]
                  if getattr(cfg, "rope_parameters", None) else cfg.rope_theta)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    w.add_uint32(f"{arch}.vocab_size", cfg.vocab_size)
    w.add_uint32(f"{arch}.rope.dimension_count", cfg.hidden_size // cfg.num_attention_heads)
    if tok is not None:
        data = json.loads(tok.to_str())
        vocab = data["model"]["vocab"]
        tokens = sorted(vocab, key=vocab.get)
        assert [vocab[t] for t in tokens] == list(range(len(tokens)))
        merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
        w.add_tokenizer_model(tokenizer_model)
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
        w.add_token_merges(merges)
        w.add_bos_token_id(vocab["<|im_start|>"])
        w.add_eos_token_id(vocab["<|im_end|>"])
        w.add_pad_token_id(vocab["<|endoftext|>"])
        w.add_add_bos_token(False)
        w.add_chat_template(template)
    state = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    names = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    parts = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for key, value in state.items():
        if key == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if key in names:
            name = names[key]
        else:
            layer, rest = key[len("model.layers."):].split(".", 1)
            part, kind = rest.rsplit(".", 1)
            name = f"blk.{layer}.{parts[part]}.{kind}"
        if ".attn_q." in name:
            value = permute(value, cfg.num_attention_heads)
        elif ".attn_k." in name:
            value = permute(value, cfg.num_key_value_heads)
        kind = (tensor_types or {}).get(name, Q.F32 if value.ndim == 1 else qtype)
        if kind == Q.F32:
            w.add_tensor(name, value)
        elif kind == Q.F16:
            w.add_tensor(name, value.astype(np.float16))
        elif kind in K_SCALES or kind == Q.IQ4_NL:  # gguf has no quantiser for these
            w.add_tensor(name, random_blocks(value.shape, kind), raw_dtype=kind)
        else:
            w.add_tensor(name, gguf.quants.quantize(value, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# where the fp16 super-block scales (d, dmin) of each K-type block lie
K_SCALES = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def random_blocks(shape, kind) -> np.ndarray:
    """Random bytes laid out as ``kind`` blocks of a (rows, cols) tensor, with small
    finite fp16 scales (random bytes there could be inf / NaN)."""
    block, size = gguf.GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(int(kind))
    raw = rng.integers(0, 256, (shape[0] * shape[1] // block, size), dtype=np.uint8)
    for at in K_SCALES.get(kind, ()):
        scale = rng.uniform(1e-3, 4e-3, raw.shape[0]).astype(np.float16)
        raw[:, at:at + 2] = scale.view(np.uint8).reshape(-1, 2)
    return raw.reshape(shape[0], -1)


def hf_from_gguf(path):
    """transformers' own GGUF loader (dequantises the whole model in float32 on CPU)."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


# -- weights ----------------------------------------------------------------------------
def test_f32_file_gives_the_source_model(tmp_path):
    """F32 storage: only renaming, transposition and the Q/K permutation are in play, so
    the file read back must be the transformers model it was written from."""
    source = llama(97, tie_word_embeddings=False)
    path = write_gguf(tmp_path / "tiny.gguf", source)
    ours = mm.from_hf(path)  # the shared entry point sniffs the file
    assert isinstance(ours, mm.TextDecoder)
    bb = ours.config.backbone
    assert (bb.kv_heads, bb.rope_base, bb.norm_type, bb.mlp_type) == (2, 500.0, "rmsnorm", "glu")
    assert not ours.config.tie_embeddings
    ids = torch.randint(0, 97, (2, 13))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), source(ids).logits, atol=1e-4, rtol=1e-4)
    got = ours.generate(ids, max_new_tokens=10)
    want = source.generate(ids, max_new_tokens=10, do_sample=False, pad_token_id=0,
                           eos_token_id=None)
    assert torch.equal(got, want)


def test_unpermute_inverts_llama_cpp_permutation():
    w = torch.randn(3 * 8, 5)
    back = mm_gguf.unpermute_qk(torch.from_numpy(permute(w.numpy(), 3)), 3)
    assert torch.equal(back, w)
    with pytest.raises(ValueError, match="even size"):
        mm_gguf.unpermute_qk(torch.randn(9, 2), 3)


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_quantised_file_matches_transformers_gguf_loader(tmp_path, qtype):
    pytest.importorskip("accelerate")  # transformers' GGUF loading needs it
    source = llama(96)
    path = write_gguf(tmp_path / f"tiny-{qtype}.gguf", source, qtype=Q[qtype])
    ours = mm_gguf.from_gguf(path)
    ref = hf_from_gguf(path)
    ids = torch.randint(0, 96, (2, 12))
    with torch.no_grad():
        want = ref(ids).logits
        torch.testing.assert_close(ours(ids), want, atol=1e-4, rtol=1e-4)
        # quantisation moved the logits away from the fp32 source's: the test sees it
        assert not torch.allclose(source(ids).logits, want, atol=1e-4, rtol=1e-4)
    assert torch.equal(ours.generate(ids, max_new_tokens=8),
                       ref.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0,
                                    eos_token_id=None))


@pytest.mark.parametrize("qtype", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_k_quant_file_matches_transformers_gguf_loader(tmp_path, qtype):
    """K types (super-blocks of 256): rows of 256, random blocks (no quantiser in gguf),
    the embedding as Q6_K as in Q4_K_M files; transformers dequantises with its own code."""
    pytest.importorskip("accelerate")
    source = llama(64, hidden_size=256, intermediate_size=256)
    types = {f"blk.{i}.{p}.weight": Q[qtype] for i in range(2)
             for p in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up")}
    path = write_gguf(tmp_path / f"tiny-{qtype}.gguf", source, qtype=Q.Q8_0,
                      tensor_types={**types, "token_embd.weight": Q.Q6_K})
    ours, ref = mm_gguf.from_gguf(path), hf_from_gguf(path)
    ids = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        want = ref(ids).logits
        torch.testing.assert_close(ours(ids), want, atol=1e-4 * float(want.abs().max()),
                                   rtol=1e-4)
    q = ours.transformer.blocks[1].attn.qkv.weight[:256]
    assert torch.equal(q, ref.model.layers[1].self_attn.q_proj.weight)


def _blocks(raw: np.ndarray, size: int) -> np.ndarray:
    return np.asarray(raw, np.uint8).reshape(-1, size)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """ggml's 4-bit order: element j < 16 is the low nibble of byte j, j >= 16 the high
    nibble of byte j - 16."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_dequantised_blocks_follow_the_ggml_formulas(tmp_path, qtype):
    """The down projection read back equals the block formula applied by hand to the
    bytes in the file (un-permuted tensors only, so no row order is involved)."""
    path = write_gguf(tmp_path / "q.gguf", llama(64), qtype=Q[qtype])
    model = mm_gguf.from_gguf(path)
    tensor = next(t for t in gguf.GGUFReader(path).tensors if t.name == "blk.1.ffn_down.weight")
    if qtype == "Q8_0":
        b = _blocks(tensor.data, 34)
        d = b[:, :2].copy().view(np.float16).astype(np.float32)
        x = d * b[:, 2:].copy().view(np.int8).astype(np.float32)
    elif qtype == "Q4_0":
        b = _blocks(tensor.data, 18)
        d = b[:, :2].copy().view(np.float16).astype(np.float32)
        x = d * (_nibbles(b[:, 2:]) - 8)
    else:
        b = _blocks(tensor.data, 20)
        d = b[:, :2].copy().view(np.float16).astype(np.float32)
        m = b[:, 2:4].copy().view(np.float16).astype(np.float32)
        x = d * _nibbles(b[:, 4:]) + m
    want = torch.from_numpy(x.reshape(64, 96))
    assert torch.equal(model.transformer.blocks[1].mlp.fc2.weight.detach(), want)


# -- bad files --------------------------------------------------------------------------
def test_unsupported_quantisation_is_named(tmp_path):
    path = write_gguf(tmp_path / "k.gguf", llama(64), qtype=Q.Q8_0,
                      tensor_types={"blk.0.ffn_up.weight": Q.IQ4_NL})
    with pytest.raises(ValueError, match=r"blk\.0\.ffn_up\.weight.*IQ4_NL.*supported: F32"):
        mm_gguf.from_gguf(path)


def test_other_architecture_is_refused(tmp_path):
    path = write_gguf(tmp_path / "qwen.gguf", llama(64), arch="qwen2")
    with pytest.raises(ValueError, match=r"qwen\.gguf.*architecture 'qwen2'.*supported: llama"):
        mm.from_hf(path)


def test_metadata_disagreeing_with_the_tensors_is_refused(tmp_path):
    source = llama(64)
    path = write_gguf(tmp_path / "deep.gguf", source)
    reader = gguf.GGUFReader(path, "r+")  # edit the header in place
    reader.fields["llama.block_count"].parts[-1][0] = 1_000_000
    reader.fields["llama.embedding_length"].parts[-1][0] = 64
    del reader
    with pytest.raises(ValueError, match=r"block_count = 1000000, but the file holds tensors "
                                         r"of 2 blocks"):
        mm_gguf.from_gguf(path)
    path = write_gguf(tmp_path / "wide.gguf", source)
    reader = gguf.GGUFReader(path, "r+")
    reader.fields["llama.vocab_size"].parts[-1][0] = 65
    del reader
    with pytest.raises(ValueError, match=r"token_embd\.weight is \(64, 64\).*\(65, 64\)"):
        mm_gguf.from_gguf(path)


@pytest.mark.parametrize("keep", [0.5, 0.999, 0.01])
def test_truncated_file_is_reported(tmp_path, bpe, keep):
    full = write_gguf(tmp_path / "full.gguf", llama(bpe.get_vocab_size()), bpe)
    data = full.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(ValueError, match=r"cut\.gguf is truncated"):
        mm_gguf.load_gguf(cut)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"PK\x03\x04 a zip, not a model")
    with pytest.raises(ValueError, match=r"fake\.gguf is not a GGUF file"):
        mm.from_hf(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        mm_gguf.from_gguf(tmp_path / "absent.gguf")
    (tmp_path / "folder.gguf").mkdir()
    with pytest.raises(ValueError, match="is a folder, not a GGUF file"):
        mm.from_hf(tmp_path / "folder.gguf")


def test_sentencepiece_vocabulary_is_refused_by_name(tmp_path, bpe):
    path = write_gguf(tmp_path / "spm.gguf", llama(bpe.get_vocab_size()), bpe,
                      tokenizer_model="llama")
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.model = 'llama'"):
        mm_gguf.gguf_tokenizer(path)
    own = mm_gguf.gguf_tokenizer(write_gguf(tmp_path / "bpe.gguf", llama(8), bpe))
    enc = mm.load_encoder(path, tokenizer=own)  # the model still loads, with your tokenizer
    assert enc.tokenizer is own and isinstance(enc.backbone, mm.TextDecoder)


# -- tokenizer and chat template --------------------------------------------------------
TEXTS = ["In the beginning God created the heaven",
         "Zürich's café: naïve  words\tand\nnew lines",
         "<|im_start|>user\nHello there<|im_end|>\n",
         "numbers 1611 and 42.5 split into digits", ""]


def test_tokenizer_rebuilt_from_metadata_matches_the_trained_one(tmp_path, bpe):
    path = write_gguf(tmp_path / "tok.gguf", llama(bpe.get_vocab_size()), bpe)
    tok = mm_gguf.gguf_tokenizer(path)
    assert isinstance(tok, mm.HFTokenizer) and tok.vocab_size == bpe.get_vocab_size()
    for text in TEXTS:
        ids = tok.encode_many([text])[0]
        assert ids == bpe.encode(text).ids, text
        assert tok.decode(ids, skip_special_tokens=False) == text
    im_start = bpe.token_to_id("<|im_start|>")
    assert im_start in tok.encode_many([TEXTS[2]])[0]  # a control token stays whole
    assert "<|im_start|>" not in tok.decode(tok.encode_many([TEXTS[2]])[0])  # and is special
    assert (tok.eos_token, tok.bos_token, tok.pad_id) == (
        "<|im_end|>", "<|im_start|>", bpe.token_to_id("<|endoftext|>"))


def test_tokenizer_and_chat_template_match_transformers(tmp_path, bpe):
    path = write_gguf(tmp_path / "tok.gguf", llama(bpe.get_vocab_size()), bpe)
    ours = mm_gguf.gguf_tokenizer(path)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    # transformers splits "smollm" text with GPT-2's rule (digit runs together); llama.cpp
    # and SmolLM2's own tokenizer.json split each digit: compare on digit-free text
    for text in TEXTS[:3]:
        assert ours.encode_many([text])[0] == theirs(text).input_ids, text
    for conversation in ([{"role": "user", "content": "Hi!"}],
                         [{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "Why?"},
                          {"role": "assistant", "content": "Because."},
                          {"role": "user", "content": "Ok"}]):
        for gen in (True, False):
            assert ours.apply_chat_template(conversation, add_generation_prompt=gen) == \
                theirs.apply_chat_template(conversation, tokenize=False,
                                           add_generation_prompt=gen)


def test_chat_template_survives_save_and_load(tmp_path, bpe):
    path = write_gguf(tmp_path / "tok.gguf", llama(bpe.get_vocab_size()), bpe)
    tok = mm_gguf.gguf_tokenizer(path)
    (tmp_path / "saved").mkdir()
    tok.save(tmp_path / "saved" / "tokenizer.json")
    back = mm.HFTokenizer.from_file(tmp_path / "saved" / "tokenizer.json")
    chat = [{"role": "user", "content": "Hi"}]
    assert back.apply_chat_template(chat) == tok.apply_chat_template(chat)
    assert (back.eos_token_id, back.pad_id) == (tok.eos_token_id, tok.pad_id)
    with pytest.raises(ValueError, match="role"):
        tok.apply_chat_template(["Hi"])


def test_load_encoder_and_chat_match_transformers(tmp_path, bpe):
    """load_encoder(file.gguf) carries the tokenizer; a chat turn is the template's prompt
    continued greedily up to the end-of-turn token, as transformers does it."""
    pytest.importorskip("accelerate")
    source = llama(bpe.get_vocab_size())
    path = write_gguf(tmp_path / "chat.gguf", source, bpe, qtype=Q.Q8_0)
    enc = mm.load_encoder(path)
    assert isinstance(enc.backbone, mm.TextDecoder) and isinstance(enc.tokenizer, mm.HFTokenizer)
    ref, ref_tok = hf_from_gguf(path), transformers.AutoTokenizer.from_pretrained(
        str(tmp_path), gguf_file=path.name)
    question = [{"role": "user", "content": "In the beginning"}]
    prompt = ref_tok.apply_chat_template(question, tokenize=True, add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)["input_ids"]
    eos = bpe.token_to_id("<|im_end|>")
    out = ref.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=eos,
                       pad_token_id=eos)[0, prompt.shape[1]:].tolist()
    want = ref_tok.decode(out[:out.index(eos)] if eos in out else out,
                          skip_special_tokens=True).strip()
    assert mm.chat(enc, question, max_new_tokens=12) == want
    assert mm.chat(enc, "In the beginning", max_new_tokens=12) == want  # str: one user turn


def test_cache_bucket_is_the_next_power_of_two_within_the_context():
    from multimodal.pipelines.chat import cache_bucket

    assert [cache_bucket(n, 8192) for n in (1, 256, 257, 600, 5000)] == \
        [256, 256, 512, 1024, 8192]
    assert cache_bucket(300, 300) == 300 and cache_bucket(100, 128) == 128


@pytest.mark.slow
def test_compiled_chat_turns_of_different_lengths_share_one_compiled_step(tmp_path, bpe):
    """chat(compile=True): the eager replies, and one compilation for two turns whose
    prompts differ in length (the static cache sized by cache_bucket)."""
    from multimodal.generation import compile_stats, compile_unavailable

    if compile_unavailable(torch.device("cpu")):
        pytest.skip("torch.compile is unavailable here")
    path = write_gguf(tmp_path / "chat.gguf", llama(bpe.get_vocab_size()), bpe, qtype=Q.Q8_0)
    enc = mm.load_encoder(path, quantize="int8")
    turns = ["In the beginning", "And the earth was without form, and void"]
    eager = [mm.chat(enc, t, max_new_tokens=8) for t in turns]
    before = compile_stats()["compilations"]
    assert [mm.chat(enc, t, max_new_tokens=8, compile=True) for t in turns] == eager
    assert compile_stats()["compilations"] == before + 1


def test_gguf_without_tokenizer_loads_the_model_only(tmp_path):
    path = write_gguf(tmp_path / "bare.gguf", llama(64))
    model, tok = mm_gguf.load_gguf(path)
    assert tok is None and isinstance(model, mm.TextDecoder)
    with pytest.raises(ValueError, match="no tokenizer"):
        mm_gguf.gguf_tokenizer(path)
    copy = tmp_path / "renamed.bin"  # sniffed by its magic bytes, not its name
    shutil.copy(path, copy)
    assert isinstance(mm.from_hf(copy), mm.TextDecoder)
