"""Contrastive image-text training of a :class:`~multimodal.models.clip.CLIP`.

With unit image features ``I`` and text features ``T`` (N, d) of N matching pairs and
``s = exp(logit_scale)``:

- ``loss="softmax"`` (CLIP's symmetric InfoNCE):
  ``L = (CE(s·I·Tᵀ, diag) + CE(s·T·Iᵀ, diag)) / 2``, each CE the mean over the N rows;
- ``loss="sigmoid"`` (SigLIP): with ``z_ij = 1`` on the diagonal and ``-1`` elsewhere,
  ``L = -(1/N) Σ_i Σ_j log σ(z_ij (s·I_i·T_j + b))``.

Under DDP every rank gathers the features of all ranks **with gradients**
(``torch.distributed.nn.functional.all_gather``, whose backward sends each rank the
gradient of its own rows) and scores its B local rows against all W·B columns, the
labels being offset by ``rank·B``. The mean of the ranks' losses is then the loss of one
process on the global batch, and DDP's gradient average is that loss's gradient
(tested in tests/tasks/test_contrastive.py).

Metrics (val / test): image->text and text->image recall@k over the whole split (a
caption identical to the true one counts as correct, so duplicate captions do not count
against the model), zero-shot accuracy on the sets the data module offers
(``zero_shot_sets``; scenes: every colour x shape prompt on held-out and seen pairs), and
the temperature ``train/logit_scale`` / ``train/temperature``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from multimodal.models.clip import CLIP, tokenize_texts
from multimodal.tasks.base import ModelTask
from multimodal.tasks.captioning import caption_tokenizer_of
from multimodal.tasks.optim import OptimizerConfig
from multimodal.tasks.pretrained import check_vocab, folder_tokenizer
from multimodal.tokenizers.hf_json import HFTokenizer
from multimodal.tokenizers.io import tokenizer_from_json, tokenizer_to_json
from multimodal.tokenizers.text import TextTokenizer

__all__ = ["ContrastiveTask", "clip_loss", "gather_with_grad", "recall_at_k", "siglip_loss",
           "zero_shot_sets_of"]


def gather_with_grad(x: Tensor) -> tuple[Tensor, int]:
    """``(cat of x over all ranks, offset of this rank's rows)``; gradients flow back to
    every rank's own rows. Without an initialised process group of more than one rank:
    ``(x, 0)``."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x, 0
    from torch.distributed.nn.functional import all_gather

    parts = all_gather(x.contiguous())
    sizes = {p.shape[0] for p in parts}
    if len(sizes) != 1:
        raise ValueError(f"ranks hold batches of different sizes {sorted(sizes)}; use "
                         "drop_last=True so every rank has the same batch")
    return torch.cat(parts), dist.get_rank() * x.shape[0]


def clip_loss(image: Tensor, text: Tensor, scale: Tensor, all_image: Tensor | None = None,
              all_text: Tensor | None = None, offset: int = 0) -> Tensor:
    """Symmetric InfoNCE of the local rows ``image`` / ``text`` (B, d) against the columns
    ``all_text`` / ``all_image`` (N, d, default the local ones); row i's match is column
    ``offset + i``."""
    all_image = image if all_image is None else all_image
    all_text = text if all_text is None else all_text
    labels = torch.arange(image.shape[0], device=image.device) + offset
    per_image = F.cross_entropy((scale * image @ all_text.T).float(), labels)
    per_text = F.cross_entropy((scale * text @ all_image.T).float(), labels)
    return (per_image + per_text) / 2


def siglip_loss(image: Tensor, text: Tensor, scale: Tensor, bias: Tensor,
                all_text: Tensor | None = None, offset: int = 0) -> Tensor:
    """SigLIP's pairwise sigmoid loss of the local images (B, d) against all texts (N, d),
    summed over the N columns and averaged over the B rows."""
    all_text = text if all_text is None else all_text
    logits = (scale * image @ all_text.T + bias).float()
    z = -torch.ones_like(logits)
    rows = torch.arange(image.shape[0], device=image.device)
    z[rows, rows + offset] = 1.0
    return -F.logsigmoid(z * logits).sum() / image.shape[0]


def recall_at_k(sim: Tensor, correct: Tensor, ks: Sequence[int]) -> dict[int, float]:
    """Share of queries (rows of ``sim``) with a correct item among their top k columns;
    ``correct`` (Q, N) is True where column n is a right answer for query q."""
    order = sim.argsort(dim=1, descending=True)
    hits = correct.gather(1, order)
    return {k: float(hits[:, :k].any(dim=1).float().mean()) for k in ks}


def zero_shot_sets_of(datamodule: Any, n: int) -> dict[str, dict[str, Any]]:
    """The zero-shot sets a data module offers through ``zero_shot_sets(n)`` (none when it
    has no such method, or ``n <= 0``), each checked: ``{"images"`` (N, C, H, W),
    ``"labels"`` (N,) indices into ``"class_names"`` (a non-empty list of strings)``}``."""
    provider = getattr(datamodule, "zero_shot_sets", None)
    if n <= 0 or provider is None:
        return {}
    sets = provider(n)
    if not isinstance(sets, dict):
        raise ValueError(f"{type(datamodule).__name__}.zero_shot_sets must return a dict of "
                         f"name -> set, got {type(sets).__name__}")
    for name, data in sets.items():
        where = f"{type(datamodule).__name__}.zero_shot_sets()[{name!r}]"
        missing = {"images", "labels", "class_names"} - set(data)
        if missing:
            raise ValueError(f"{where} lacks {sorted(missing)}")
        images, labels, names = data["images"], data["labels"], data["class_names"]
        if isinstance(names, str) or len(names) == 0:
            raise ValueError(f"{where}['class_names'] must be a non-empty list of names")
        if not isinstance(images, Tensor) or images.dim() != 4:
            raise ValueError(f"{where}['images'] must be a (N, C, H, W) tensor")
        if not isinstance(labels, Tensor) or labels.shape != (images.shape[0],):
            raise ValueError(f"{where}['labels'] must be a ({images.shape[0]},) tensor, one "
                             f"label per image, got {getattr(labels, 'shape', labels)}")
        if labels.numel() and not (int(labels.min()) >= 0 and int(labels.max()) < len(names)):
            raise ValueError(f"{where}['labels'] must lie in [0, {len(names)}), got "
                             f"[{int(labels.min())}, {int(labels.max())}]")
    return sets


class ContrastiveTask(ModelTask):
    """Train a :class:`CLIP` on batches ``{"images", "captions"}`` from
    :class:`~multimodal.data.captions.CaptionDataModule` with AdamW and warm-up + cosine.

    The tokenizer is trained on the training captions (``setup``) and travels in the
    checkpoint. Logs ``train/loss``, ``train/logit_scale``, ``train/temperature``
    (= 1/s), ``{val,test}/loss``, ``{val,test}/i2t_R@k`` and ``t2i_R@k`` for k in
    ``recall_ks``, and ``{val,test}/zero_shot_<name>`` for every set the data module offers
    through ``zero_shot_sets(n)`` (:func:`zero_shot_sets_of`; scenes: ``heldout`` / ``seen``,
    prompts ``templates`` over every "colour shape" class name, combined per class by
    ``zero_shot_ensemble``: see :meth:`CLIP.zero_shot`).
    """

    accepts = (CLIP,)
    optimizer_defaults = OptimizerConfig(lr=1e-3, weight_decay=0.1,
                                         warmup_fraction=0.05, min_lr_ratio=0.01)

    default_monitor = ("val/t2i_R@1", "max")  # the CLI's default ModelCheckpoint ranks by it

    def __init__(
        self,
        model: CLIP | None = None,
        tokenizer: Literal["word", "wordpiece"] = "word",
        recall_ks: Sequence[int] = (1, 5, 10),
        templates: Sequence[str] = ("a small {}", "a large {}"),
        zero_shot_size: int = 500,
        zero_shot_ensemble: Literal["mean", "sum"] = "mean",
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        if tokenizer not in ("word", "wordpiece"):
            raise ValueError(f"tokenizer must be 'word' or 'wordpiece', got {tokenizer!r}")
        if zero_shot_ensemble not in ("mean", "sum"):
            raise ValueError(f"zero_shot_ensemble must be 'mean' or 'sum', got "
                             f"{zero_shot_ensemble!r}")
        if not recall_ks or min(recall_ks) < 1:
            raise ValueError(f"recall_ks must be positive integers, got {recall_ks}")
        self.save_hyperparameters(ignore=["model"])
        self.tokenizer: TextTokenizer | None = None
        self.tokenizer = folder_tokenizer(self.pretrained_source)  # a pretrained folder's own
        if self.tokenizer is not None:
            check_vocab(self.tokenizer, self.model.config.text.vocab_size,
                        f"pretrained {self.hparams.pretrained}")
        self._outputs: dict[str, list[tuple[Tensor, Tensor, list[str]]]] = {}
        self._zero_shot: dict[str, dict[str, Any]] = {}

    # -- data plumbing -------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        dm = self.datamodule
        if self.tokenizer is None:
            self.tokenizer = caption_tokenizer_of(dm, self.hparams.tokenizer,
                                                  self.model.config.text.vocab_size,
                                                  type(self).__name__)
        self._zero_shot = zero_shot_sets_of(dm, self.hparams.zero_shot_size)

    def tokenize(self, captions: Sequence[str]) -> dict[str, Tensor]:
        if self.tokenizer is None:
            raise ValueError("the tokenizer is not trained yet: call setup() (fit/test do)")
        self.model.check_tokenizer(self.tokenizer)
        if isinstance(self.tokenizer, HFTokenizer):  # a pretrained folder's: its own specials
            pool, context = self.model.config.text_pool, self.model.config.text.max_len
            batch = self.tokenizer.encode_batch(  # "last" pooling (SigLIP): full context
                list(captions), max_length=context,
                padding="max_length" if pool == "last" else True)
        else:
            batch = tokenize_texts(self.tokenizer, captions, self.model.config.text_pool)
        return {k: v.to(self.device) for k, v in batch.items()}

    # -- loss ------------------------------------------------------------------------------
    def loss(self, image: Tensor, text: Tensor) -> Tensor:
        """The configured loss of this rank's unit features, against the global batch."""
        all_image, offset = gather_with_grad(image)
        all_text, _ = gather_with_grad(text)
        scale = self.model.scale()
        if self.model.config.loss == "sigmoid":
            return siglip_loss(image, text, scale, self.model.logit_bias, all_text, offset)
        return clip_loss(image, text, scale, all_image, all_text, offset)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        images = batch["images"]
        features = self.model.forward_features(images, **self.tokenize(batch["captions"]))
        image, text = features.unbind(dim=1)
        loss = self.loss(image, text)
        b = images.shape[0]
        self.log_train("train/loss", loss, prog_bar=True, batch_size=b)
        self.log_train("train/logit_scale", self.model.logit_scale.detach(), batch_size=b)
        self.log_train("train/temperature", 1.0 / self.model.scale().detach(), batch_size=b)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.model.clamp_logit_scale()

    # -- evaluation ------------------------------------------------------------------------
    def _eval_step(self, batch: dict[str, Any], split: str) -> None:
        images, captions = batch["images"], list(batch["captions"])
        image, text = self.model.forward_features(images, **self.tokenize(captions)).unbind(1)
        self.log_mean(f"{split}/loss", self.loss(image, text), images.shape[0])
        self._outputs.setdefault(split, []).append((image.detach(), text.detach(), captions))

    def _eval_end(self, split: str) -> None:
        outs = self._outputs.pop(split, [])
        if not outs:
            return
        image = torch.cat([o[0] for o in outs])
        text = torch.cat([o[1] for o in outs])
        captions = [c for o in outs for c in o[2]]
        sim = image @ text.T
        ids = {c: i for i, c in enumerate(dict.fromkeys(captions))}
        cid = torch.tensor([ids[c] for c in captions], device=sim.device)
        same = cid[:, None] == cid[None, :]
        ks = [k for k in self.hparams.recall_ks if k <= len(captions)]
        for name, s in (("i2t", sim), ("t2i", sim.T)):
            for k, r in recall_at_k(s, same, ks).items():
                self.log(f"{split}/{name}_R@{k}", r, prog_bar=k == 1)
        for pairs, data in self._zero_shot.items():
            self.log(f"{split}/zero_shot_{pairs}", self.zero_shot_accuracy(data))

    @torch.no_grad()
    def zero_shot_accuracy(self, data: dict[str, Any]) -> float:
        """Top-1 accuracy of ``model.zero_shot`` on ``{"images", "labels", "class_names"}``."""
        assert self.tokenizer is not None
        probs = []
        for chunk in data["images"].split(256):
            probs.append(self.model.zero_shot(chunk.to(self.device), data["class_names"],
                                              self.hparams.templates, tokenizer=self.tokenizer,
                                              ensemble=self.hparams.get("zero_shot_ensemble",
                                                                        "mean")))
        pred = torch.cat(probs).argmax(dim=1).cpu()
        return float((pred == data["labels"]).float().mean())

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self._eval_end("val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._eval_end("test")

    # -- the tokenizer travels with the checkpoint -----------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.tokenizer is not None:
            checkpoint["tokenizer"] = tokenizer_to_json(self.tokenizer)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        text = checkpoint.get("tokenizer")
        if isinstance(text, str):
            self.tokenizer = tokenizer_from_json(text)
