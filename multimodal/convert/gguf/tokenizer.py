"""The tokenizer of a GGUF file: ``tokenizer.ggml.*`` rebuilt as a ``tokenizers`` byte-level
BPE with its chat template (:func:`gguf_tokenizer`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from multimodal.convert.gguf.reader import field, open_gguf
from multimodal.tokenizers.hf_json import HFTokenizer
from multimodal.tokenizers.io import byte_alphabet

# tokenizer.ggml.pre -> how text is split before the byte-level BPE, as llama.cpp does
# (llama-vocab.cpp); None: GPT-2's split
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE_TOKENIZERS = {"default": None, "gpt2": None, "gpt-2": None,
                   "smollm": "digits", "starcoder": "digits", "refact": "digits",
                   "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT,
                   "llama-bpe": _LLAMA3_SPLIT}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def _pre_tokenizer(pre: str | None, add_prefix_space: bool, path: Path) -> Any:
    from tokenizers import Regex, pre_tokenizers

    if pre is not None and pre not in _PRE_TOKENIZERS:
        raise ValueError(f"{path}: tokenizer.ggml.pre = {pre!r} is not supported; supported: "
                         f"{sorted(_PRE_TOKENIZERS)}")
    split = _PRE_TOKENIZERS.get(pre or "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space,
                                          use_regex=split is None or split == "digits")
    if split is None:
        return byte_level
    if split == "digits":  # every digit its own piece, then GPT-2's split
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        byte_level])
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                    byte_level])


def read_tokenizer(reader: Any, path: Path) -> HFTokenizer:
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    kind = field(reader, "tokenizer.ggml.model")
    if kind is None:
        raise ValueError(f"{path} holds no tokenizer (no tokenizer.ggml.model)")
    if kind != "gpt2":
        raise ValueError(f"{path}: tokenizer.ggml.model = {kind!r} is not supported; only "
                         "byte-level BPE ('gpt2', e.g. SmolLM2, Llama 3) is rebuilt. Pass a "
                         "tokenizer yourself (load_encoder(path, tokenizer=...))")
    tokens = field(reader, "tokenizer.ggml.tokens")
    merges = field(reader, "tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise ValueError(f"{path}: a byte-level BPE tokenizer needs tokenizer.ggml.tokens "
                         "and tokenizer.ggml.merges")
    types = field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise ValueError(f"{path}: tokenizer.ggml.token_type has {len(types)} entries, "
                         f"tokenizer.ggml.tokens {len(tokens)}")
    alphabet = set(byte_alphabet().values())
    vocab = {token: i for i, token in enumerate(tokens)}
    pairs = []
    for i, merge in enumerate(merges):
        left, sep, right = merge.partition(" ")
        if not sep:
            raise ValueError(f"{path}: tokenizer.ggml.merges[{i}] = {merge!r} is not 'a b'")
        pairs.append((left, right))
    backend = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False))
    backend.pre_tokenizer = _pre_tokenizer(field(reader, "tokenizer.ggml.pre"),
                                           bool(field(reader, "tokenizer.ggml.add_space_prefix",
                                                       False)), path)
    backend.decoder = decoders.ByteLevel()
    # control tokens (<|im_start|>, ...) stay whole and are skipped on decoding; user-defined
    # ones stay whole too; a control token outside the byte alphabet would be a mislabel
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, k in zip(tokens, types, strict=True)
                                if k == _CONTROL and set(t) <= alphabet])
    backend.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, k in zip(tokens, types, strict=True) if k == _USER_DEFINED])

    def special(key: str) -> str | None:
        i = field(reader, f"tokenizer.ggml.{key}_token_id")
        if i is None:
            return None
        if not 0 <= int(i) < len(tokens):
            raise ValueError(f"{path}: tokenizer.ggml.{key}_token_id = {i} is outside the "
                             f"vocabulary of {len(tokens)}")
        return tokens[int(i)]

    bos, eos = special("bos"), special("eos")
    add_bos = bool(field(reader, "tokenizer.ggml.add_bos_token", False)) and bos is not None
    add_eos = bool(field(reader, "tokenizer.ggml.add_eos_token", False)) and eos is not None
    if add_bos or add_eos:
        single = [*([bos] if add_bos else []), "$A", *([eos] if add_eos else [])]
        backend.post_processor = processors.TemplateProcessing(
            single=" ".join(single),
            special_tokens=[(t, vocab[t]) for t in {bos if add_bos else None,
                                                    eos if add_eos else None} - {None}])
    pad = special("padding")
    return HFTokenizer(backend, pad_id=vocab[pad] if pad is not None else 0,
                       chat_template=field(reader, "tokenizer.chat_template"),
                       bos_token=bos, eos_token=eos)


def gguf_tokenizer(path: str | os.PathLike) -> HFTokenizer:
    """The tokenizer described by a GGUF file's metadata, with its chat template.

    Byte-level BPE (``tokenizer.ggml.model == "gpt2"``): the vocabulary and merges as
    stored, split before BPE as llama.cpp does for ``tokenizer.ggml.pre`` (``"smollm"``:
    each digit alone, then GPT-2's split; ``"llama-bpe"``: Llama 3's split; default:
    GPT-2's), tokens typed *control* as special tokens (kept whole, dropped by
    ``decode``), *user-defined* ones kept whole, BOS / EOS added when
    ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` say so, padding with
    ``tokenizer.ggml.padding_token_id``. SentencePiece vocabularies (``"llama"``) are
    refused by name."""
    path = Path(path)
    return read_tokenizer(open_gguf(path), path)
