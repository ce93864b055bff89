"""Image captioning with a :class:`~multimodal.models.captioner.Captioner`.

Teacher forcing: a caption becomes ``[BOS] w_1 .. w_T [EOS] [PAD]..``; the decoder reads
all but the last column and is trained to predict the next token,
``L = -1/|T| sum_t log p(w_t | w_<t, image)``, with ``[PAD]`` targets ignored.

The tokenizer is trained on the training captions only (``setup``) and travels in the
checkpoint: word-level for the procedural scenes (their grammar has ~20 words), WordPiece
for emoji names (open vocabulary).

Metrics on val / test, from greedy (or beam) decoding:

- ``bleu4``: corpus BLEU-4 (``torchmetrics.text.BLEUScore``) against the one reference;
- ``exact_match``: the generated caption equals the reference word for word (both
  normalised by the tokenizer);
- whatever checks the data module supplies with ``caption_checks(split)`` (a dict
  ``name -> check(caption, index)``), logged as the fraction that pass: the scenes give
  ``scene_match``, the caption is grammatical, names exactly the scene's shapes and every
  stated relation holds, in any naming order. Scene captions name the shapes in a random
  order, so this is the compositional exact match (``exact_match`` would also demand the
  random order). The val / test loaders must not shuffle (item ``i`` of batch ``k`` is
  item ``k * batch_size + i`` of the split).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics.text import BLEUScore

from multimodal.models.captioner import Captioner, decode_captions
from multimodal.tasks.base import ModelTask
from multimodal.tasks.optim import OptimizerConfig
from multimodal.tasks.pretrained import check_vocab, folder_tokenizer
from multimodal.tokenizers.io import tokenizer_from_json, tokenizer_to_json
from multimodal.tokenizers.text import (
    MASK_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    TextTokenizer,
    WordPieceTokenizer,
    WordTokenizer,
)

__all__ = ["CaptioningTask", "train_caption_tokenizer"]

IGNORE_INDEX = -100


def caption_tokenizer_of(datamodule: Any, kind: Literal["word", "wordpiece"],
                         vocab_size: int, task: str) -> TextTokenizer:
    """:func:`train_caption_tokenizer` over the data module's ``train_captions()``; a clear
    error naming ``task`` when the data module has none."""
    if datamodule is None or not hasattr(datamodule, "train_captions"):
        raise ValueError(f"{task} trains its tokenizer on the data module's "
                         "train_captions(): use a CaptionDataModule or set .tokenizer")
    return train_caption_tokenizer(datamodule.train_captions(), kind, vocab_size)


def train_caption_tokenizer(captions: list[str], kind: Literal["word", "wordpiece"],
                            vocab_size: int) -> TextTokenizer:
    """A tokenizer over ``captions``: every word (``"word"``) or a WordPiece vocabulary of
    at most ``vocab_size`` entries (``"wordpiece"``)."""
    if not captions:
        raise ValueError("no training captions to train the tokenizer on")
    if kind == "word":
        tok = WordTokenizer.train(captions, vocab_size=None, lowercase=True)
    elif kind == "wordpiece":
        tok = WordPieceTokenizer.train(captions, vocab_size=vocab_size, min_frequency=2)
    else:
        raise ValueError(f"tokenizer must be 'word' or 'wordpiece', got {kind!r}")
    if tok.vocab_size > vocab_size:
        raise ValueError(f"the training captions hold {tok.vocab_size} distinct tokens but the "
                         f"decoder's vocab_size is {vocab_size}: raise decoder.vocab_size")
    return tok


class CaptioningTask(ModelTask):
    """Train a :class:`Captioner` on batches ``{"images", "captions"}`` from
    :class:`~multimodal.data.captions.CaptionDataModule` with AdamW and warm-up + cosine.
    Logs ``{train,val,test}/loss`` and ``{val,test}/bleu4``, ``/exact_match`` (and the
    data module's ``caption_checks``, e.g. ``/scene_match`` on scenes); after test prints
    example captions and writes them to ``captions_test.txt`` in the run's log folder.
    """

    accepts = (Captioner,)
    optimizer_defaults = OptimizerConfig(lr=1e-3, weight_decay=0.05,
                                         warmup_fraction=0.05, min_lr_ratio=0.01)

    default_monitor = ("val/bleu4", "max")  # the CLI's default ModelCheckpoint ranks by it

    def __init__(
        self,
        model: Captioner | None = None,
        tokenizer: Literal["word", "wordpiece"] = "word",
        label_smoothing: float = 0.0,
        num_beams: int = 1,
        max_new_tokens: int | None = None,
        num_examples: int = 8,
        input_dropout: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        if not 0.0 <= input_dropout <= 1.0:
            raise ValueError(f"input_dropout must be in [0, 1], got {input_dropout}")
        if tokenizer not in ("word", "wordpiece"):
            raise ValueError(f"tokenizer must be 'word' or 'wordpiece', got {tokenizer!r}")
        self.save_hyperparameters(ignore=["model"])
        self.tokenizer: TextTokenizer | None = None
        self.tokenizer = folder_tokenizer(self.pretrained_source)  # a pretrained folder's own
        if self.tokenizer is not None:
            check_vocab(self.tokenizer, self.model.config.decoder.vocab_size,
                        f"pretrained {self.hparams.pretrained}")
        self.val_bleu = BLEUScore(n_gram=4)
        self.test_bleu = BLEUScore(n_gram=4)
        self.examples: list[tuple[str, str]] = []
        self._checks: dict[str, dict[str, Callable[[str, int], bool]]] = {}
        self._eval_batch_size = 0

    # -- data plumbing -----------------------------------------------------------------
    def setup(self, stage: str) -> None:
        dm = self.datamodule
        if self.tokenizer is None:
            self.tokenizer = caption_tokenizer_of(dm, self.hparams.tokenizer,
                                                  self.model.config.decoder.vocab_size,
                                                  type(self).__name__)
        if dm is not None and callable(getattr(dm, "caption_checks", None)):
            self._prepare_checks(dm)

    def _prepare_checks(self, dm: Any) -> None:
        """The data module's own checks of generated val / test captions."""
        self._checks = {split: dm.caption_checks(split) for split in ("val", "test")}
        self._eval_batch_size = dm.batch_size

    def encode_captions(self, captions: list[str]) -> Tensor:
        """Right-padded ``[BOS] .. [EOS]`` ids (B, T); a caption longer than the decoder's
        context is a ValueError."""
        if self.tokenizer is None:
            raise ValueError("the tokenizer is not trained yet: call setup() (fit/test do)")
        seqs = self.tokenizer.encode_many(captions, add_bos=True, add_eos=True)
        longest = max((len(s) for s in seqs), default=0)
        if longest > self.model.max_len:
            i = max(range(len(seqs)), key=lambda j: len(seqs[j]))
            raise ValueError(f"caption {captions[i]!r} is {longest} tokens with [BOS]/[EOS], "
                             f"longer than the decoder's context of {self.model.max_len}; "
                             "raise decoder.max_len")
        return self.tokenizer.pad(seqs)["input_ids"].to(self.device)

    # -- training ----------------------------------------------------------------------
    def drop_inputs(self, ids: Tensor) -> Tensor:
        """Word dropout on the decoder's *inputs*: each non-special token is replaced by
        ``[MASK]`` with probability ``input_dropout`` (targets stay intact). It weakens
        the language prior (e.g. "blue" is never followed by "circle" in training) and
        makes the decoder read the image instead."""
        p = self.hparams.input_dropout
        if p == 0.0:
            return ids
        drop = (torch.rand(ids.shape, device=ids.device) < p) & (ids >= len(SPECIAL_TOKENS))
        return ids.masked_fill(drop, MASK_ID)

    def loss(self, images: Tensor, ids: Tensor, inputs: Tensor | None = None) -> Tensor:
        """Mean cross-entropy of ``ids[:, 1:]`` given ``inputs[:, :-1]`` (default ``ids``),
        ``[PAD]`` targets ignored."""
        inputs = ids if inputs is None else inputs
        logits = self.model(images, inputs[:, :-1])
        labels = ids[:, 1:].masked_fill(ids[:, 1:] == PAD_ID, IGNORE_INDEX)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                               ignore_index=IGNORE_INDEX,
                               label_smoothing=self.hparams.label_smoothing)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        images = batch["images"]
        ids = self.encode_captions(batch["captions"])
        loss = self.loss(images, ids, self.drop_inputs(ids))
        self.log_train("train/loss", loss, prog_bar=True, batch_size=images.shape[0])
        return loss

    # -- evaluation --------------------------------------------------------------------
    def caption(self, images: Tensor, **generate_kwargs: Any) -> list[str]:
        """Generated captions (strings) for a batch of normalised images."""
        if self.tokenizer is None:
            raise ValueError("the tokenizer is not trained yet: call setup() (fit/test do)")
        kwargs = {"num_beams": self.hparams.num_beams,
                  "max_new_tokens": self.hparams.max_new_tokens, **generate_kwargs}
        ids = self.model.generate(images, **kwargs)
        return decode_captions(ids, self.tokenizer, self.model.config.eos_token_id)

    def _eval(self, batch: dict[str, Any], batch_idx: int, split: str) -> None:
        images, refs = batch["images"], list(batch["captions"])
        b = images.shape[0]
        self.log_mean(f"{split}/loss", self.loss(images, self.encode_captions(refs)), b,
                      prog_bar=True)
        assert self.tokenizer is not None
        preds = self.caption(images)
        refs = [self.tokenizer.normalize(r) for r in refs]
        bleu = self.val_bleu if split == "val" else self.test_bleu
        bleu.update(preds, [[r] for r in refs])
        self.log(f"{split}/bleu4", bleu, batch_size=b)
        em = sum(p == r for p, r in zip(preds, refs, strict=True)) / b
        self.log_mean(f"{split}/exact_match", em, b, prog_bar=True)
        start = batch_idx * self._eval_batch_size
        for name, check in self._checks.get(split, {}).items():
            hits = [check(p, start + i) for i, p in enumerate(preds)]
            self.log_mean(f"{split}/{name}", sum(hits) / b, b, prog_bar=True)
        if split == "test" and len(self.examples) < self.hparams.num_examples:
            self.examples.extend(zip(preds, refs, strict=True))
            self.examples = self.examples[: self.hparams.num_examples]

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval(batch, batch_idx, "val")

    def on_test_epoch_start(self) -> None:
        self.examples = []

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval(batch, batch_idx, "test")

    def on_test_epoch_end(self) -> None:
        if not self.trainer.is_global_zero or not self.examples:
            return
        lines = [f"generated: {p}\nreference: {r}\n" for p, r in self.examples]
        print("example test captions:\n" + "\n".join(lines))
        folder = self.trainer.log_dir or self.trainer.default_root_dir
        if folder:
            path = Path(folder) / "captions_test.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(lines), encoding="utf-8")

    # -- the tokenizer travels with the checkpoint -------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.tokenizer is not None:
            checkpoint["tokenizer"] = tokenizer_to_json(self.tokenizer)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        text = checkpoint.get("tokenizer")
        if isinstance(text, str):
            self.tokenizer = tokenizer_from_json(text)
