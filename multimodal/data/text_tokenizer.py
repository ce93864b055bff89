"""The tokenizer a text data module uses instead of training a WordPiece: ``tokenizer`` is a
``tokenizer.json`` (a Hugging Face one, read through
:class:`~multimodal.tokenizers.hf_json.HFTokenizer`, or one written by the package's own
tokenizers) or a folder holding one.

The package's own tokenizers have fixed special ids (``[PAD]`` 0 ... ``[EOS]`` 6). A Hugging
Face tokenizer has its own, and they come from it, never from the package's defaults:

* ``pad``: the pad token of ``tokenizer_config.json`` / ``special_tokens_map.json`` beside
  the file, else the file's padding setting, else 0 (:meth:`HFTokenizer.from_file`);
* ``start`` / ``end``: the tokens the file's post-processor puts before and after a text
  (BERT ``[CLS]`` / ``[SEP]``, CLIP ``<|startoftext|>`` / ``<|endoftext|>``, Llama ``<s>``),
  found by encoding one word with and without special tokens;
* ``bos`` / ``eos``: the named ``bos_token`` / ``eos_token`` of the files beside, else
  ``start`` / ``end`` (BERT: ``[CLS]`` / ``[SEP]``).

An encoder's input (classification, a seq2seq source) goes through the post-processor
(:func:`encode_for_encoder`); a language-model stream and a decoder target are plain ids
joined with ``eos`` (:func:`encode_plain`), a target framed by ``bos`` / ``eos``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multimodal.data.shards import read_shard_file, read_shard_meta
from multimodal.tokenizers.hf_json import HFTokenizer
from multimodal.tokenizers.io import (
    read_tokenizer,
    tokenizer_file,
    tokenizer_from_json,
    tokenizer_to_json,
)
from multimodal.tokenizers.text import (
    BOS_ID,
    CLS_ID,
    EOS_ID,
    PAD_ID,
    TextTokenizer,
)

__all__ = [
    "AnyTextTokenizer",
    "SpecialIds",
    "TrainedTokenizerState",
    "encode_for_encoder",
    "encode_plain",
    "given_tokenizer",
    "same_on_every_rank",
    "shard_tokenizer",
    "special_ids",
    "specials_from_dict",
    "specials_to_dict",
    "tokenizer_from_text",
]

AnyTextTokenizer = TextTokenizer | HFTokenizer

_NAMED = ("bos_token", "eos_token", "cls_token", "sep_token")


@dataclass(frozen=True)
class SpecialIds:
    """Special token ids of a tokenizer (None: it has no such token)."""

    pad: int
    bos: int | None
    eos: int | None
    start: tuple[int, ...] = ()  # what the encoder input starts with
    end: tuple[int, ...] = ()  # ... and ends with


OWN_SPECIAL_IDS = SpecialIds(PAD_ID, BOS_ID, EOS_ID, (CLS_ID,), ())


def _named_ids(tok: HFTokenizer, folder: Path | None) -> dict[str, int]:
    """``bos_token`` ... ids named in the folder's ``tokenizer_config.json`` /
    ``special_tokens_map.json`` (first file wins per name)."""
    out: dict[str, int] = {}
    if folder is None:
        return out
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        side = folder / name
        if not side.is_file():
            continue
        payload = json.loads(side.read_text(encoding="utf-8"))
        for key in _NAMED:
            value = payload.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if key not in out and isinstance(value, str):
                token_id = tok.backend.token_to_id(value)
                if token_id is not None:
                    out[key] = int(token_id)
    return out


def _frame(tok: HFTokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ids the post-processor puts before and after a text."""
    word = "hello"
    plain = tok.backend.encode(word, add_special_tokens=False).ids
    full = tok.backend.encode(word, add_special_tokens=True).ids
    for i in range(len(full) - len(plain) + 1):
        if full[i: i + len(plain)] == plain:
            return tuple(full[:i]), tuple(full[i + len(plain):])
    return (), ()


def special_ids(tok: AnyTextTokenizer, folder: str | Path | None = None) -> SpecialIds:
    """The special ids of ``tok`` (see the module docstring); ``folder``: where the
    tokenizer's ``tokenizer_config.json`` lies (the folder of its ``tokenizer.json``)."""
    if not isinstance(tok, HFTokenizer):
        return OWN_SPECIAL_IDS
    start, end = _frame(tok)
    named = _named_ids(tok, Path(folder) if folder is not None else None)
    bos = named.get("bos_token", start[0] if start else named.get("cls_token"))
    eos = named.get("eos_token", end[-1] if end else named.get("sep_token"))
    return SpecialIds(tok.pad_id, bos, eos, start, end)


def encode_plain(tok: AnyTextTokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Ids of each text without any special token."""
    if isinstance(tok, HFTokenizer):
        return [e.ids for e in tok.backend.encode_batch(list(texts), add_special_tokens=False)]
    return tok.encode_many(list(texts))


def encode_for_encoder(tok: AnyTextTokenizer, texts: Sequence[str],
                       max_length: int) -> list[list[int]]:
    """Encoder inputs of at most ``max_length`` ids: the package's tokenizers put ``[CLS]``
    first; a Hugging Face one adds what its post-processor adds (BERT: ``[CLS] .. [SEP]``),
    the special tokens kept when a text is cut."""
    if isinstance(tok, HFTokenizer):
        return tok.encode_many(list(texts), max_length=max_length, truncation=True)
    return tok.encode_many(list(texts), add_cls=True, max_length=max_length, truncation=True)


def tokenizer_from_text(text: str, specials: SpecialIds | None = None) -> AnyTextTokenizer:
    """A tokenizer from the text of its ``tokenizer.json`` (a shard sidecar); ``specials``
    (saved beside it) restore a Hugging Face tokenizer's pad id."""
    tok = tokenizer_from_json(text)
    if isinstance(tok, HFTokenizer) and specials is not None:
        tok.pad_id = specials.pad
    return tok


def specials_to_dict(ids: SpecialIds) -> dict[str, object]:
    return {"pad": ids.pad, "bos": ids.bos, "eos": ids.eos, "start": list(ids.start),
            "end": list(ids.end)}


def specials_from_dict(d: dict[str, object]) -> SpecialIds:
    return SpecialIds(int(d["pad"]), d.get("bos"), d.get("eos"),  # type: ignore[arg-type]
                      tuple(d.get("start", ())), tuple(d.get("end", ())))  # type: ignore[arg-type]


def same_on_every_rank(datamodule: object, tok: AnyTextTokenizer) -> AnyTextTokenizer:
    """Rank 0's tokenizer on every rank of a distributed run (``tok`` itself otherwise).

    ``tokenizers`` breaks ties between equally frequent pieces in hash order, which differs
    from process to process: ranks that each train a WordPiece on the same texts may number
    the pieces differently, and then the same id means another piece on each rank. Rank 0's
    is broadcast (``trainer.strategy.broadcast``); a collective call, made by every rank.
    """
    trainer = getattr(datamodule, "trainer", None)
    if trainer is None or getattr(trainer, "world_size", 1) < 2:
        return tok
    mine = tokenizer_to_json(tok)
    agreed = trainer.strategy.broadcast(mine, src=0)
    return tok if agreed == mine else tokenizer_from_text(agreed)



def given_tokenizer(spec: str) -> tuple[AnyTextTokenizer, SpecialIds]:
    """The ``tokenizer.json`` that ``spec`` names (the file or a folder holding one) and its
    special ids (a Hugging Face one's read from the files beside it)."""
    path = tokenizer_file(spec)
    tok = read_tokenizer(path)
    return tok, special_ids(tok, path.parent)


def shard_tokenizer(shards: str, meta: dict[str, Any] | None = None, side: str = ""
                    ) -> tuple[AnyTextTokenizer, SpecialIds]:
    """The tokenizer shards were encoded with, and its special ids, both kept in the shards
    (``side``: ``"source"`` / ``"target"`` of pair shards, whose files and meta keys it
    prefixes). ``meta``: the shards' ``multimodal.json``, read when not given; shards written
    before the special ids were kept get the package's own."""
    meta = read_shard_meta(shards) if meta is None else meta
    prefix = f"{side}_" if side else ""
    key = f"{prefix}specials"
    specials = specials_from_dict(meta[key]) if key in meta else OWN_SPECIAL_IDS
    return tokenizer_from_text(read_shard_file(shards, f"{prefix}tokenizer.json"), specials), \
        specials

class TrainedTokenizerState:
    """Checkpoints of a text data module keep the WordPiece(s) it trained, and its splits.

    ``tokenizers`` does not train the same ids twice (ties are broken in hash order), so a run
    resumed, tested or predicting from the checkpoint must not train its own again. A module
    lists its trained tokenizers under their checkpoint keys (:meth:`_trained_keys`,
    :meth:`_trained_tokenizers`) and restores them (:meth:`_restore_tokenizers`); texts
    already encoded with another tokenizer are encoded again when next asked for. List it
    before the other bases.
    """

    datasets: dict[str, Any]
    shards: str | None

    def _trained_keys(self) -> list[str]:
        """Checkpoint keys of the tokenizers trained here (none from files or shards)."""
        raise NotImplementedError

    def _trained_tokenizers(self) -> dict[str, AnyTextTokenizer]:
        """``key -> tokenizer`` of those trained so far (empty before training)."""
        raise NotImplementedError

    def _restore_tokenizers(self, texts: dict[str, str]) -> None:
        """Installs the tokenizers of ``key -> tokenizer.json text``."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        state = dict(super().state_dict())  # type: ignore[misc]
        state.update({k: tokenizer_to_json(t) for k, t in self._trained_tokenizers().items()})
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)  # type: ignore[misc]
        restored = {k: text for k in self._trained_keys()
                    if (text := state_dict.get(k)) is not None}
        if not restored:
            return
        current = self._trained_tokenizers()
        if current and all(tokenizer_to_json(current[k]) == text for k, text in restored.items()):
            return
        self._restore_tokenizers(restored)
        self.datasets = {}

    def split_dataset(self, split: str) -> Any:
        self.setup()  # type: ignore[attr-defined]
        if split not in self.datasets:
            raise ValueError(f"{self.shards} has no {split} split")
        return self.datasets[split]
