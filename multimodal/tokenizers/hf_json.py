"""A Hugging Face ``tokenizer.json`` (read by the ``tokenizers`` library) behind the calls
of the package's text tokenizers, so a folder imported with ``mm.from_hf`` turns strings
into ids exactly as its own tokenizer does (CLIP's byte-level BPE, BERT's WordPiece, ...).

The file's own pipeline decides everything model-specific: normaliser, pre-tokenizer,
model, and the post-processor that adds the special tokens (CLIP:
``<|startoftext|> ... <|endoftext|>``; BERT: ``[CLS] ... [SEP]``). The ``add_cls`` /
``add_sep`` / ``add_bos`` / ``add_eos`` switches of the package's own tokenizers are
therefore accepted and ignored. Truncation to ``max_length`` is the library's: it counts
the special tokens, so the end-of-text token survives. Padding is on the right with the
pad token named in the folder's ``tokenizer_config.json`` / ``special_tokens_map.json``
(CLIP's is ``<|endoftext|>``), else the file's padding setting, else id 0.

A chat model's tokenizer carries its chat template (``tokenizer_config.json``'s
``chat_template``, or a GGUF file's ``tokenizer.chat_template``): a Jinja template over
``messages`` (``[{"role": ..., "content": ...}]``) rendered by
:meth:`HFTokenizer.apply_chat_template` as transformers renders it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from multimodal.tokenizers.text import pad_sequences

__all__ = ["HFTokenizer", "is_hf_tokenizer_file"]


def is_hf_tokenizer_file(path: str | Path) -> bool:
    """True for a Hugging Face ``tokenizer.json`` (a ``model`` object and no package
    ``type``), False for one written by the package's own tokenizers."""
    try:
        payload = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(payload, dict) and isinstance(payload.get("model"), dict) \
        and "type" not in payload


@lru_cache(maxsize=8)
def _compiled_template(source: str) -> Any:
    """A chat template compiled once, in transformers' environment: sandboxed, immutable,
    ``trim_blocks`` / ``lstrip_blocks``, loop controls, ``raise_exception(message)``."""
    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class HFTokenizer:
    """Strings -> right-padded ``input_ids`` / ``attention_mask`` through a
    ``tokenizers.Tokenizer`` (see the module docstring)."""

    def __init__(self, backend: Any, pad_id: int = 0, *, chat_template: str | None = None,
                 bos_token: str | None = None, eos_token: str | None = None) -> None:
        from tokenizers import Tokenizer

        if not isinstance(backend, Tokenizer):
            raise TypeError(f"backend must be a tokenizers.Tokenizer, got "
                            f"{type(backend).__name__}")
        for name, token in (("bos_token", bos_token), ("eos_token", eos_token)):
            if token is not None and backend.token_to_id(token) is None:
                raise ValueError(f"{name} {token!r} is not in the vocabulary")
        self.backend = backend
        self.pad_id = int(pad_id)
        self.chat_template = chat_template
        self.bos_token, self.eos_token = bos_token, eos_token

    @property
    def eos_token_id(self) -> int | None:
        """The id of the end-of-sequence token (a chat model's end of turn), if known."""
        return None if self.eos_token is None else self.backend.token_to_id(self.eos_token)

    @property
    def bos_token_id(self) -> int | None:
        return None if self.bos_token is None else self.backend.token_to_id(self.bos_token)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = True, **variables: Any) -> str:
        """The chat as the model was trained to read it: ``self.chat_template`` rendered
        over ``messages`` (``[{"role": "user", "content": "..."}, ...]``) with
        ``bos_token``, ``eos_token``, ``add_generation_prompt`` (end with the opening of
        the assistant's turn) and ``variables``, in a sandboxed Jinja environment set up
        as transformers' (``trim_blocks``, ``lstrip_blocks``, ``raise_exception``)."""
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template (tokenizer_config.json's "
                             "chat_template, or a GGUF file's tokenizer.chat_template)")
        if isinstance(messages, (str, Mapping)) or not all(
                isinstance(m, Mapping) and "role" in m and "content" in m for m in messages):
            raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts")
        return _compiled_template(self.chat_template).render(
            messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "", **variables)

    @classmethod
    def from_file(cls, path: str | Path) -> HFTokenizer:
        """Read ``tokenizer.json`` (and the pad token from the files beside it)."""
        from tokenizers import Tokenizer

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file {path} does not exist")
        backend = Tokenizer.from_file(str(path))
        pad_id = None
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            side = path.parent / name
            if pad_id is None and side.is_file():
                token = _token_text(json.loads(side.read_text(encoding="utf-8"))
                                    .get("pad_token"))
                if token is not None:
                    pad_id = backend.token_to_id(token)
                    if pad_id is None:
                        raise ValueError(f"{side}: pad_token {token!r} is not in {path}")
        if pad_id is None and backend.padding is not None:
            pad_id = backend.padding.get("pad_id")
        backend.no_padding()
        backend.no_truncation()
        chat: dict[str, Any] = {}
        side = path.parent / "tokenizer_config.json"
        if side.is_file():
            config = json.loads(side.read_text(encoding="utf-8"))
            template = config.get("chat_template")
            if isinstance(template, str):
                chat["chat_template"] = template
            for name in ("bos_token", "eos_token"):
                token = _token_text(config.get(name))
                if token is not None and backend.token_to_id(token) is not None:
                    chat[name] = token
        return cls(backend, 0 if pad_id is None else pad_id, **chat)

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def save(self, path: str | Path) -> None:
        """``tokenizer.json`` at ``path``; a chat template, when there is one, goes to
        ``tokenizer_config.json`` beside it (with the BOS / EOS / pad tokens), where
        :meth:`from_file` finds it again."""
        self.backend.save(str(path))
        if self.chat_template is not None:
            config = {"chat_template": self.chat_template, "bos_token": self.bos_token,
                      "eos_token": self.eos_token,
                      "pad_token": self.backend.id_to_token(self.pad_id)}
            (Path(path).parent / "tokenizer_config.json").write_text(
                json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")

    def encode_many(self, texts: Sequence[str], *, max_length: int | None = None,
                    truncation: bool = True, **_specials: bool) -> list[list[int]]:
        """Unpadded ids of several texts, special tokens as the file's post-processor adds
        them; cut to ``max_length`` (special tokens kept) unless ``truncation=False``, which
        makes a longer text an error."""
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise TypeError(f"expected a list of str, got {type(texts).__name__}")
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"texts[{i}] is a {type(text).__name__}, not a str")
        if max_length is not None and truncation:
            self.backend.enable_truncation(max_length)
        try:
            out = [e.ids for e in self.backend.encode_batch(list(texts))]
        finally:
            self.backend.no_truncation()
        if max_length is not None and not truncation:
            for i, ids in enumerate(out):
                if len(ids) > max_length:
                    raise ValueError(f"texts[{i}] has {len(ids)} tokens, more than "
                                     f"max_length={max_length}; pass truncation=True")
        return out

    def pad(self, sequences: Sequence[Sequence[int]], *, max_length: int | None = None,
            pad_to_max_length: bool = False) -> dict[str, torch.Tensor]:
        """Right-pad with the pad id into ``input_ids`` and ``attention_mask`` (B, L)."""
        return pad_sequences(sequences, self.pad_id, max_length=max_length,
                             pad_to_max_length=pad_to_max_length)

    def encode_batch(self, texts: Sequence[str], *, padding: bool | str = True,
                     truncation: bool = True, max_length: int | None = None,
                     **_specials: bool) -> dict[str, torch.Tensor]:
        """``{"input_ids", "attention_mask"}`` (B, L): ``padding=True`` pads to the longest
        text, ``"max_length"`` to ``max_length``."""
        if padding not in (True, False, "longest", "max_length"):
            raise ValueError(f"padding must be True, False, 'longest' or 'max_length', "
                             f"got {padding!r}")
        if len(texts) == 0:
            raise ValueError("encode_batch() expects at least one text, got an empty list")
        seqs = self.encode_many(texts, max_length=max_length, truncation=truncation)
        if padding is False and len({len(s) for s in seqs}) > 1:
            raise ValueError("texts have different lengths; use padding=True")
        return self.pad(seqs, max_length=max_length,
                        pad_to_max_length=padding == "max_length")

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decode_batch(self, rows: Sequence[Sequence[int]]) -> list[str]:
        return [self.decode(r) for r in rows]
