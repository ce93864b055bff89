"""Text tokenizers: word pieces, whole words and characters behind one interface.

Three ways to cut text into integer tokens, which trade vocabulary size against
sequence length and out-of-vocabulary (OOV) rate:

* :class:`WordPieceTokenizer` -- sub-word units learnt with the ``tokenizers`` library
  (BERT-style WordPiece: ``"tokenization" -> ["token", "##ization"]``). An unseen word is
  spelt out with known pieces, so it becomes ``[UNK]`` only when one of its characters was
  never seen in training.
* :class:`WordTokenizer` -- the ``N`` most frequent whole words; every other word is ``[UNK]``.
* :class:`CharTokenizer` -- every character seen in training; no OOV on similar text, but
  the longest sequences.

All three share the special tokens ``[PAD] [UNK] [CLS] [SEP] [MASK] [BOS] [EOS]`` with the
fixed ids 0..6 (in that order), and the same methods:

``train`` (classmethod), ``encode``, ``encode_many``, ``encode_batch``, ``pad``, ``decode``,
``decode_batch``, ``normalize``, ``tokenize``, ``save`` / ``load`` (one JSON file), ``len()``.

Conventions (documented behaviour for edge cases):

* ``encode("")`` returns ``[]`` (or just the requested special tokens).
* A text longer than ``max_length`` is cut at the end when ``truncation=True`` and raises
  ``ValueError`` when ``truncation=False``. Special tokens are kept when cutting.
* ``decode`` raises ``ValueError`` on an id outside ``[0, vocab_size)``.
* Unknown text stays visible: ``decode`` writes ``[UNK]`` for it even with
  ``skip_special_tokens=True`` (which drops only the structural tokens ``[PAD] [CLS] [SEP]
  [MASK] [BOS] [EOS]``), as BERT tokenizers do. After every ``encode`` / ``encode_many`` /
  ``encode_batch`` call, ``last_unknown_count`` holds how many ``[UNK]`` ids it produced, and
  ``unknowns(text)`` lists the pieces of a text that become ``[UNK]``.
* ``encode`` raises ``TypeError`` when given anything but a ``str``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch

SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[BOS]", "[EOS]")
"""Special tokens; the id of each is its index here (``[PAD]`` = 0 ... ``[EOS]`` = 6)."""

PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID, BOS_ID, EOS_ID = range(len(SPECIAL_TOKENS))

FORMAT_VERSION = 1

# A word is a run of letters/digits/underscore; every other non-space character is its own
# token. This matches BERT's pre-tokenizer (whitespace + punctuation split) for ASCII text.
_WORD_RE = re.compile(r"\w+|[^\w\s]")
_SPACE_BEFORE_PUNCT = re.compile(r" ([.,;:!?)\]}'])")
_SPACE_AFTER_OPEN = re.compile(r"([(\[{]) ")

T = TypeVar("T", bound="TextTokenizer")


def _check_text(text: Any, what: str = "text") -> str:
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a str, got {type(text).__name__}: {text!r:.60}")
    return text


def iter_training_texts(texts_or_files: Iterable[str] | Iterable[Path]) -> Iterator[str]:
    """Yield training texts from an iterable of strings or of ``pathlib.Path`` files.

    A ``str`` item is text; a ``pathlib.Path`` item is a UTF-8 file whose content is text.
    """
    if isinstance(texts_or_files, (str, Path)):
        raise TypeError(
            "train() expects an iterable of texts (str) or of file paths (pathlib.Path), "
            f"got a single {type(texts_or_files).__name__}; wrap it in a list"
        )
    for item in texts_or_files:
        if isinstance(item, Path):
            if not item.is_file():
                raise FileNotFoundError(f"training file {item} does not exist")
            yield item.read_text(encoding="utf-8", errors="replace")
        elif isinstance(item, str):
            yield item
        else:
            raise TypeError(
                "train() expects texts (str) or file paths (pathlib.Path), "
                f"got an item of type {type(item).__name__}"
            )


def clean_up_spaces(text: str) -> str:
    """Remove the space that token joining puts before punctuation: "hi , you !" -> "hi, you!".

    Lossy on purpose (the original spacing is not stored); for display only.
    """
    text = _SPACE_BEFORE_PUNCT.sub(r"\1", text)
    return _SPACE_AFTER_OPEN.sub(r"\1", text)


def pad_sequences(sequences: Sequence[Sequence[int]], pad_id: int, *,
                  max_length: int | None = None,
                  pad_to_max_length: bool = False) -> dict[str, torch.Tensor]:
    """Right-pad id lists with ``pad_id`` into ``input_ids`` and ``attention_mask`` (B, L).

    ``L`` is the longest sequence, or ``max_length`` when ``pad_to_max_length``.
    ``attention_mask[b, t] = 1`` for real tokens and ``0`` for padding.
    """
    if len(sequences) == 0:
        raise ValueError("expected at least one sequence to pad, got an empty list")
    longest = max(len(s) for s in sequences)
    if pad_to_max_length:
        if max_length is None:
            raise ValueError("pad_to_max_length=True needs max_length")
        if longest > max_length:
            raise ValueError(f"a sequence has {longest} tokens > max_length={max_length}")
        longest = max_length
    input_ids = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), longest), dtype=torch.long)
    for b, seq in enumerate(sequences):
        input_ids[b, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
        attention_mask[b, : len(seq)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


class TextTokenizer:
    """Shared behaviour: special tokens, truncation, padding, id checks, JSON save/load.

    Subclasses implement :meth:`_encode_texts` (text -> ids without special tokens),
    :meth:`_decode_ids`, :meth:`normalize`, :meth:`tokenize`, :attr:`vocab_size`,
    :meth:`id_to_token`, :meth:`token_to_id` and the JSON payload (``_to_dict`` / ``_from_dict``).
    """

    kind: ClassVar[str] = "base"

    # --- special tokens -------------------------------------------------------------------
    pad_token_id: ClassVar[int] = PAD_ID
    unk_token_id: ClassVar[int] = UNK_ID
    cls_token_id: ClassVar[int] = CLS_ID
    sep_token_id: ClassVar[int] = SEP_ID
    mask_token_id: ClassVar[int] = MASK_ID
    bos_token_id: ClassVar[int] = BOS_ID
    eos_token_id: ClassVar[int] = EOS_ID
    special_tokens: ClassVar[tuple[str, ...]] = SPECIAL_TOKENS

    last_unknown_count: int = 0
    """How many ``[UNK]`` ids the latest ``encode`` / ``encode_many`` / ``encode_batch`` call
    produced, over all its texts (after truncation). 0 means no text was lost."""

    @property
    def special_token_ids(self) -> list[int]:
        return list(range(len(SPECIAL_TOKENS)))

    @staticmethod
    def _drop_structural(ids: list[int]) -> list[int]:
        """``ids`` without the structural special tokens; ``[UNK]`` stays (it stands for text)."""
        n_special = len(SPECIAL_TOKENS)
        return [i for i in ids if i >= n_special or i == UNK_ID]

    # --- to be provided by subclasses -----------------------------------------------------
    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def _encode_texts(self, texts: list[str]) -> list[list[int]]:
        raise NotImplementedError

    def _decode_ids(self, ids: list[int], skip_special_tokens: bool) -> str:
        raise NotImplementedError

    def normalize(self, text: str) -> str:
        """The text as the tokenizer sees it: normalised, tokens joined by single spaces.

        For in-vocabulary text ``decode(encode(text)) == normalize(text)``.
        """
        raise NotImplementedError

    def tokenize(self, text: str) -> list[str]:
        """The token strings of ``text`` (no special tokens)."""
        return [self.id_to_token(i) for i in self.encode(text)]

    def unknowns(self, text: str) -> list[str]:
        """The pieces of ``text`` that encode to ``[UNK]``, in order; ``[]`` when none is lost."""
        raise NotImplementedError

    def id_to_token(self, token_id: int) -> str:
        raise NotImplementedError

    def token_to_id(self, token: str) -> int | None:
        raise NotImplementedError

    def _to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def _from_dict(cls: type[T], payload: dict[str, Any]) -> T:
        raise NotImplementedError

    # --- encoding -------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.vocab_size

    def encode(
        self,
        text: str,
        *,
        add_cls: bool = False,
        add_sep: bool = False,
        add_bos: bool = False,
        add_eos: bool = False,
        max_length: int | None = None,
        truncation: bool = True,
    ) -> list[int]:
        """Token ids of one text.

        Layout: ``[CLS]? [BOS]? tokens [SEP]? [EOS]?``. With ``max_length`` the tokens are cut
        (``truncation=True``) so that the whole sequence, special tokens included, fits.
        """
        _check_text(text)
        return self.encode_many(
            [text], add_cls=add_cls, add_sep=add_sep, add_bos=add_bos, add_eos=add_eos,
            max_length=max_length, truncation=truncation,
        )[0]

    def encode_many(
        self,
        texts: Sequence[str],
        *,
        add_cls: bool = False,
        add_sep: bool = False,
        add_bos: bool = False,
        add_eos: bool = False,
        max_length: int | None = None,
        truncation: bool = True,
    ) -> list[list[int]]:
        """Token ids of several texts, unpadded (see :meth:`encode`).

        Sets :attr:`last_unknown_count` to the number of ``[UNK]`` ids in the result.
        """
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise TypeError(
                f"expected a list of str, got {type(texts).__name__}; "
                "use encode() for a single text"
            )
        texts = [_check_text(t, f"texts[{i}]") for i, t in enumerate(texts)]
        prefix = [CLS_ID] * add_cls + [BOS_ID] * add_bos
        suffix = [SEP_ID] * add_sep + [EOS_ID] * add_eos
        budget = None
        if max_length is not None:
            if max_length < len(prefix) + len(suffix):
                raise ValueError(
                    f"max_length={max_length} leaves no room for the "
                    f"{len(prefix) + len(suffix)} requested special tokens"
                )
            budget = max_length - len(prefix) - len(suffix)
        out = []
        for i, ids in enumerate(self._encode_texts(texts)):
            if budget is not None and len(ids) > budget:
                if not truncation:
                    raise ValueError(
                        f"texts[{i}] has {len(ids) + len(prefix) + len(suffix)} tokens, more "
                        f"than max_length={max_length}; pass truncation=True to cut it"
                    )
                ids = ids[:budget]
            out.append(prefix + ids + suffix)
        self.last_unknown_count = sum(ids.count(UNK_ID) for ids in out)
        return out

    def pad(
        self,
        sequences: Sequence[Sequence[int]],
        *,
        max_length: int | None = None,
        pad_to_max_length: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Right-pad id lists with ``[PAD]`` into ``input_ids`` and ``attention_mask`` (B, L).

        ``L`` is the longest sequence, or ``max_length`` when ``pad_to_max_length``.
        ``attention_mask[b, t] = 1`` for real tokens and ``0`` for padding.
        """
        return pad_sequences(sequences, PAD_ID, max_length=max_length,
                             pad_to_max_length=pad_to_max_length)

    def encode_batch(
        self,
        texts: Sequence[str],
        *,
        padding: bool | str = True,
        truncation: bool = True,
        max_length: int | None = None,
        add_cls: bool = False,
        add_sep: bool = False,
        add_bos: bool = False,
        add_eos: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Encode a batch into ``{"input_ids": LongTensor (B, L), "attention_mask": LongTensor}``.

        ``padding=True`` pads to the longest text, ``padding="max_length"`` to ``max_length``,
        ``padding=False`` requires all texts to have the same length. Padding is on the right.
        """
        if padding not in (True, False, "longest", "max_length"):
            raise ValueError(
                f"padding must be True, False, 'longest' or 'max_length', got {padding!r}"
            )
        if len(texts) == 0:
            raise ValueError("encode_batch() expects at least one text, got an empty list")
        seqs = self.encode_many(
            texts, add_cls=add_cls, add_sep=add_sep, add_bos=add_bos, add_eos=add_eos,
            max_length=max_length, truncation=truncation,
        )
        if padding is False:
            lengths = sorted({len(s) for s in seqs})
            if len(lengths) > 1:
                raise ValueError(
                    f"padding=False needs texts of equal token length, got lengths {lengths}"
                )
        return self.pad(seqs, max_length=max_length, pad_to_max_length=padding == "max_length")

    # --- decoding -------------------------------------------------------------------------
    def _check_ids(self, ids: Sequence[int] | torch.Tensor) -> list[int]:
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1:
                raise ValueError(
                    f"decode() expects a 1-D tensor of ids, got shape {tuple(ids.shape)}; "
                    "use decode_batch() for a batch"
                )
            ids = ids.tolist()
        elif isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise TypeError(f"decode() expects a list of ints, got {type(ids).__name__}")
        out = []
        vocab_size = self.vocab_size
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int):
                raise TypeError(f"token ids must be int, got {type(i).__name__}: {i!r}")
            if not 0 <= i < vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {vocab_size})")
            out.append(i)
        return out

    def decode(
        self,
        ids: Sequence[int] | torch.Tensor,
        *,
        skip_special_tokens: bool = True,
        clean_up_spaces: bool = False,
    ) -> str:
        """Text of a list (or 1-D tensor) of ids; tokens are joined with single spaces.

        ``skip_special_tokens`` drops ``[PAD] [CLS] [SEP] [MASK] [BOS] [EOS]``; an unknown token
        is always written as ``[UNK]`` so that lost text stays visible.
        ``clean_up_spaces=True`` also removes the space before punctuation (lossy, for display).
        """
        text = self._decode_ids(self._check_ids(ids), skip_special_tokens)
        return _clean(text) if clean_up_spaces else text

    def decode_batch(
        self,
        batch: Sequence[Sequence[int]] | torch.Tensor,
        *,
        skip_special_tokens: bool = True,
        clean_up_spaces: bool = False,
    ) -> list[str]:
        """Decode each row of a (B, L) tensor or list of id lists. ``[PAD]`` is dropped when
        ``skip_special_tokens`` (the default)."""
        if isinstance(batch, torch.Tensor) and batch.dim() != 2:
            raise ValueError(f"decode_batch() expects a 2-D tensor, got shape {tuple(batch.shape)}")
        return [
            self.decode(row, skip_special_tokens=skip_special_tokens,
                        clean_up_spaces=clean_up_spaces)
            for row in batch
        ]

    # --- persistence ----------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the tokenizer to one JSON file (parent folders are created)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"type": self.kind, "format_version": FORMAT_VERSION,
                   "special_tokens": list(SPECIAL_TOKENS), **self._to_dict()}
        path.write_text(json.dumps(payload, ensure_ascii=False), encoding="utf-8")
        return path

    @classmethod
    def load(cls: type[T], path: str | Path) -> T:
        """Read a tokenizer written by :meth:`save`.

        Called on :class:`TextTokenizer` it returns whichever kind the file holds; called on
        a subclass it checks that the file holds that kind.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file {path} does not exist")
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not a tokenizer JSON file: {err}") from None
        kind = payload.get("type") if isinstance(payload, dict) else None
        registry = _kinds()
        if kind not in registry:
            raise ValueError(
                f"{path} holds no tokenizer of a known type (expected 'type' in "
                f"{sorted(registry)}, got {kind!r})"
            )
        if cls is not TextTokenizer and registry[kind] is not cls:
            raise ValueError(f"{path} holds a {kind!r} tokenizer, not a {cls.kind!r} one")
        if payload.get("special_tokens") != list(SPECIAL_TOKENS):
            raise ValueError(f"{path} has special tokens {payload.get('special_tokens')}, "
                             f"expected {list(SPECIAL_TOKENS)}")
        return registry[kind]._from_dict(payload)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


def _kinds() -> dict[str, type[TextTokenizer]]:
    """Every concrete tokenizer kind, by its ``kind`` (subclasses elsewhere, such as the
    phoneme tokenizer, register themselves by subclassing; the package's ``__init__``
    imports them all)."""
    found: dict[str, type[TextTokenizer]] = {}
    todo = list(TextTokenizer.__subclasses__())
    while todo:
        c = todo.pop()
        todo.extend(c.__subclasses__())
        if "kind" in vars(c):
            found[c.kind] = c
    return found


def _clean(text: str) -> str:
    return clean_up_spaces(text)


def load_tokenizer(path: str | Path) -> TextTokenizer:
    """Load any tokenizer written by ``save`` (the kind is read from the file)."""
    return TextTokenizer.load(path)


# ======================================================================================
# WordPiece
# ======================================================================================


class WordPieceTokenizer(TextTokenizer):
    """BERT-style WordPiece tokenizer backed by the ``tokenizers`` library.

    Pipeline: BERT normaliser (clean control characters, optional lowercase + accent strip)
    -> BERT pre-tokenizer (split on whitespace and punctuation) -> WordPiece (greedy longest
    match, continuation pieces prefixed with ``##``) -> WordPiece decoder.
    """

    kind: ClassVar[str] = "wordpiece"

    def __init__(self, backend: Any, lowercase: bool = True) -> None:
        from tokenizers import Tokenizer

        if not isinstance(backend, Tokenizer):
            raise TypeError(f"backend must be a tokenizers.Tokenizer, got {type(backend).__name__}")
        for i, tok in enumerate(SPECIAL_TOKENS):
            if backend.token_to_id(tok) != i:
                raise ValueError(
                    f"backend vocabulary must have {tok} at id {i}, got {backend.token_to_id(tok)}"
                )
        self.backend = backend
        self.lowercase = lowercase

    @staticmethod
    def _new_backend(lowercase: bool) -> Any:
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

        backend = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
        backend.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=lowercase,
            lowercase=lowercase,
        )
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        # cleanup=False keeps decode exact up to spacing: tokens joined by single spaces.
        backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)
        return backend

    @classmethod
    def train(
        cls,
        texts_or_files: Iterable[str] | Iterable[Path],
        vocab_size: int = 8000,
        min_frequency: int = 2,
        lowercase: bool = True,
        limit_alphabet: int | None = None,
        show_progress: bool = False,
    ) -> WordPieceTokenizer:
        """Learn a WordPiece vocabulary of at most ``vocab_size`` entries (specials included).

        ``texts_or_files``: an iterable of texts (``str``) or of UTF-8 files (``pathlib.Path``).
        ``min_frequency``: a merged piece must occur at least this often. Every character seen
        is kept in the alphabet (unless ``limit_alphabet``), so unseen words of seen characters
        are spelt out with pieces instead of becoming ``[UNK]``.
        """
        from tokenizers import trainers

        if vocab_size <= len(SPECIAL_TOKENS):
            raise ValueError(f"vocab_size must exceed {len(SPECIAL_TOKENS)}, got {vocab_size}")
        if min_frequency < 1:
            raise ValueError(f"min_frequency must be >= 1, got {min_frequency}")
        backend = cls._new_backend(lowercase)
        options: dict[str, Any] = {}
        if limit_alphabet is not None:
            options["limit_alphabet"] = limit_alphabet
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS), continuing_subword_prefix="##",
            show_progress=show_progress, **options,
        )
        n_seen = 0

        def counted() -> Iterator[str]:
            nonlocal n_seen
            for text in iter_training_texts(texts_or_files):
                n_seen += 1
                yield text

        backend.train_from_iterator(counted(), trainer=trainer)
        if n_seen == 0:
            raise ValueError("train() got no training text")
        return cls(backend, lowercase=lowercase)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def _encode_texts(self, texts: list[str]) -> list[list[int]]:
        encodings = self.backend.encode_batch(texts, add_special_tokens=False)
        return [e.ids for e in encodings]

    def _decode_ids(self, ids: list[int], skip_special_tokens: bool) -> str:
        if skip_special_tokens:
            ids = self._drop_structural(ids)
        # the backend would drop [UNK] with the other specials: we skip them ourselves
        return self.backend.decode(ids, skip_special_tokens=False)

    def unknowns(self, text: str) -> list[str]:
        _check_text(text)
        encoding = self.backend.encode(text, add_special_tokens=False)
        pieces = zip(encoding.ids, encoding.offsets, strict=True)
        return [text[start:end] for i, (start, end) in pieces if i == UNK_ID]

    def normalize(self, text: str) -> str:
        _check_text(text)
        normalized = self.backend.normalizer.normalize_str(text)
        words = self.backend.pre_tokenizer.pre_tokenize_str(normalized)
        return " ".join(w for w, _ in words)

    def tokenize(self, text: str) -> list[str]:
        _check_text(text)
        return self.backend.encode(text, add_special_tokens=False).tokens

    def id_to_token(self, token_id: int) -> str:
        (token_id,) = self._check_ids([token_id])
        return self.backend.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def _to_dict(self) -> dict[str, Any]:
        return {"lowercase": self.lowercase, "tokenizer": json.loads(self.backend.to_str())}

    @classmethod
    def _from_dict(cls, payload: dict[str, Any]) -> WordPieceTokenizer:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_str(json.dumps(payload["tokenizer"])),
                   lowercase=bool(payload.get("lowercase", True)))


# ======================================================================================
# Vocabulary-list tokenizers (words, characters)
# ======================================================================================


class VocabTokenizer(TextTokenizer):
    """A tokenizer defined by a list of token strings (id = position) and a splitter."""

    def __init__(self, vocab: Sequence[str], lowercase: bool = False) -> None:
        vocab = list(vocab)
        if vocab[: len(SPECIAL_TOKENS)] != list(SPECIAL_TOKENS):
            raise ValueError(f"vocab must start with {list(SPECIAL_TOKENS)}, got {vocab[:7]}")
        if len(set(vocab)) != len(vocab):
            raise ValueError("vocab has duplicate entries")
        self.vocab = vocab
        self.lowercase = lowercase
        self._index = {tok: i for i, tok in enumerate(vocab)}

    # splitting: overridden by the subclass
    def _split(self, text: str) -> list[str]:
        raise NotImplementedError

    def _join(self, tokens: list[str]) -> str:
        raise NotImplementedError

    def _prepare(self, text: str) -> str:
        return text.lower() if self.lowercase else text

    @classmethod
    def _count(cls, texts_or_files: Iterable[str] | Iterable[Path], lowercase: bool) -> Counter:
        probe = cls.__new__(cls)
        probe.lowercase = lowercase
        counts: Counter = Counter()
        n_seen = 0
        for text in iter_training_texts(texts_or_files):
            counts.update(probe._split(probe._prepare(text)))
            n_seen += 1
        if n_seen == 0:
            raise ValueError("train() got no training text")
        return counts

    @classmethod
    def _from_counts(
        cls, counts: Counter, vocab_size: int | None, min_frequency: int, lowercase: bool
    ) -> VocabTokenizer:
        if vocab_size is not None and vocab_size <= len(SPECIAL_TOKENS):
            raise ValueError(f"vocab_size must exceed {len(SPECIAL_TOKENS)}, got {vocab_size}")
        if min_frequency < 1:
            raise ValueError(f"min_frequency must be >= 1, got {min_frequency}")
        # most frequent first; ties broken alphabetically so training is deterministic
        ranked = sorted(
            (t for t, c in counts.items() if c >= min_frequency and t not in SPECIAL_TOKENS),
            key=lambda t: (-counts[t], t),
        )
        if vocab_size is not None:
            ranked = ranked[: vocab_size - len(SPECIAL_TOKENS)]
        return cls([*SPECIAL_TOKENS, *ranked], lowercase=lowercase)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def _encode_texts(self, texts: list[str]) -> list[list[int]]:
        index = self._index
        return [[index.get(t, UNK_ID) for t in self._split(self._prepare(x))] for x in texts]

    def _decode_ids(self, ids: list[int], skip_special_tokens: bool) -> str:
        if skip_special_tokens:
            ids = self._drop_structural(ids)
        return self._join([self.vocab[i] for i in ids])

    def unknowns(self, text: str) -> list[str]:
        _check_text(text)
        return [t for t in self._split(self._prepare(text)) if t not in self._index]

    def tokenize(self, text: str) -> list[str]:
        _check_text(text)
        return [t if t in self._index else "[UNK]" for t in self._split(self._prepare(text))]

    def id_to_token(self, token_id: int) -> str:
        (token_id,) = self._check_ids([token_id])
        return self.vocab[token_id]

    def token_to_id(self, token: str) -> int | None:
        return self._index.get(token)

    def _to_dict(self) -> dict[str, Any]:
        return {"lowercase": self.lowercase, "vocab": self.vocab}

    @classmethod
    def _from_dict(cls, payload: dict[str, Any]) -> VocabTokenizer:
        return cls(payload["vocab"], lowercase=bool(payload.get("lowercase", False)))


class WordTokenizer(VocabTokenizer):
    """Whole words: split on whitespace and punctuation, keep the ``N`` most frequent words.

    A word outside the vocabulary becomes ``[UNK]`` -- the OOV problem of a fixed dictionary.
    """

    kind: ClassVar[str] = "word"

    def _split(self, text: str) -> list[str]:
        return _WORD_RE.findall(text)

    def _join(self, tokens: list[str]) -> str:
        return " ".join(tokens)

    def normalize(self, text: str) -> str:
        _check_text(text)
        return " ".join(self._split(self._prepare(text)))

    @classmethod
    def train(
        cls,
        texts_or_files: Iterable[str] | Iterable[Path],
        vocab_size: int | None = 8000,
        min_frequency: int = 1,
        lowercase: bool = True,
    ) -> WordTokenizer:
        """Keep the ``vocab_size - 7`` most frequent words seen at least ``min_frequency`` times
        (every such word when ``vocab_size`` is None)."""
        counts = cls._count(texts_or_files, lowercase)
        return cls._from_counts(counts, vocab_size, min_frequency, lowercase)  # type: ignore[return-value]


class CharTokenizer(VocabTokenizer):
    """Single characters (whitespace included): every character seen in training.

    Unseen words never become ``[UNK]``; only characters never seen in training do.
    """

    kind: ClassVar[str] = "char"

    def _split(self, text: str) -> list[str]:
        return list(text)

    def _join(self, tokens: list[str]) -> str:
        return "".join(tokens)

    def normalize(self, text: str) -> str:
        _check_text(text)
        return self._prepare(text)

    @classmethod
    def train(
        cls,
        texts_or_files: Iterable[str] | Iterable[Path],
        vocab_size: int | None = None,
        min_frequency: int = 1,
        lowercase: bool = False,
    ) -> CharTokenizer:
        """Keep every character seen (or the ``vocab_size - 7`` most frequent ones)."""
        counts = cls._count(texts_or_files, lowercase)
        return cls._from_counts(counts, vocab_size, min_frequency, lowercase)  # type: ignore[return-value]


__all__ = [
    "SPECIAL_TOKENS",
    "CharTokenizer",
    "TextTokenizer",
    "VocabTokenizer",
    "WordPieceTokenizer",
    "WordTokenizer",
    "clean_up_spaces",
    "iter_training_texts",
    "load_tokenizer",
]
