"""BERT-style training of a :class:`~multimodal.models.text.TextEncoder`: masked-LM
pre-training, then sequence classification on the ``[CLS]`` token.

Masking (BERT): each non-special token is *chosen* independently with probability
``mask_prob`` (0.15). Of the chosen tokens, 80% become ``[MASK]``, 10% a random
non-special token, 10% stay as they are. The label is the original token at chosen
positions and ``-100`` (ignored by the loss) everywhere else, so the loss is
``L = -1/|C| sum_{t in C} log p(x_t | x~)`` over the chosen set ``C`` only.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from multimodal.loading import from_pretrained
from multimodal.models.text import TextEncoder
from multimodal.tasks.base import ModelTask
from multimodal.tasks.classification import ClassificationTask
from multimodal.tasks.optim import OptimizerConfig
from multimodal.tokenizers.text import MASK_ID, SPECIAL_TOKENS

__all__ = ["MaskedLMTask", "SequenceClassificationTask", "load_encoder_weights",
           "mask_tokens"]

IGNORE_INDEX = -100


def mask_tokens(
    input_ids: Tensor,
    vocab_size: int,
    *,
    mask_prob: float = 0.15,
    mask_token_id: int = MASK_ID,
    num_special: int = len(SPECIAL_TOKENS),
    attention_mask: Tensor | None = None,
    replace_probs: tuple[float, float] = (0.8, 0.1),
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT masking of ``input_ids`` (B, N) -> ``(masked inputs, labels)``.

    Ids ``< num_special`` (``[PAD] [CLS] [SEP]`` ...) and positions where ``attention_mask``
    is 0 are never chosen. ``replace_probs = (p_mask, p_random)``: of the chosen tokens a
    share ``p_mask`` becomes ``mask_token_id``, ``p_random`` a uniform random id in
    ``[num_special, vocab_size)``, the rest is kept.
    """
    if not 0.0 <= mask_prob <= 1.0:
        raise ValueError(f"mask_prob must be in [0, 1], got {mask_prob}")
    p_mask, p_random = replace_probs
    if p_mask < 0 or p_random < 0 or p_mask + p_random > 1:
        raise ValueError(f"replace_probs must be two non-negative shares summing to <= 1, "
                         f"got {replace_probs}")
    if vocab_size <= num_special:
        raise ValueError(f"vocab_size ({vocab_size}) must exceed num_special ({num_special})")
    maskable = input_ids >= num_special
    if attention_mask is not None:
        maskable &= attention_mask.bool()
    u = torch.rand(input_ids.shape, generator=generator, device=input_ids.device)
    chosen = maskable & (u < mask_prob)
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    action = torch.rand(input_ids.shape, generator=generator, device=input_ids.device)
    to_mask = chosen & (action < p_mask)
    to_random = chosen & (action >= p_mask) & (action < p_mask + p_random)
    random_ids = torch.randint(num_special, vocab_size, input_ids.shape, generator=generator,
                               device=input_ids.device)
    masked = input_ids.masked_fill(to_mask, mask_token_id)
    masked = torch.where(to_random, random_ids, masked)
    return masked, labels


def mlm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy over the positions whose label is not ``-100``."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                           ignore_index=IGNORE_INDEX)


class MaskedLMTask(ModelTask):
    """Masked-LM pre-training of a :class:`TextEncoder` (with ``mlm_head=True``).

    Batches are dicts with ``input_ids`` and optionally ``attention_mask`` (e.g. from
    :class:`~multimodal.data.text.SourceClassificationDataModule`, labels ignored, or
    :class:`~multimodal.data.text.TextCorpusDataModule`). Validation masks with a fixed
    seed per batch, so ``val/loss`` and ``val/acc`` (accuracy of the masked-token
    predictions) are comparable across epochs. With ``save_dir`` the encoder is written
    there (``save_pretrained``) at the end of training, ready for a text
    :class:`~multimodal.tasks.classification.ClassificationTask`'s ``pretrained``.
    """

    accepts = (TextEncoder,)
    optimizer_defaults = OptimizerConfig(lr=1e-3, weight_decay=0.01,
                                         warmup_fraction=0.05, min_lr_ratio=0.1)

    def __init__(
        self,
        model: TextEncoder | None = None,
        mask_prob: float = 0.15,
        save_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.save_hyperparameters(ignore=["model"])

    def build_model(self, model: TextEncoder | None, *, pretrained: str | None,
                    preset: str | None, overrides: dict[str, Any] | None,
                    data_sizes: dict[str, Any] | None) -> tuple[TextEncoder, Any]:
        """The encoder, with an MLM head (a tied decoder) where it is built here."""
        if pretrained is not None or preset is not None:
            overrides = {"mlm_head": True, **(overrides or {})}
        model, source = self.model_from(model, pretrained=pretrained, preset=preset,
                                        overrides=overrides, data_sizes=data_sizes,
                                        modality="text")
        if model.mlm is None:
            raise ValueError("model must be a TextEncoder built with mlm_head=True, got "
                             f"{type(model).__name__} without one")
        return model, source

    def step(self, batch: dict[str, Tensor],
             generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(loss, logits, labels) of one batch after masking."""
        ids, mask = batch["input_ids"], batch.get("attention_mask")
        masked, labels = mask_tokens(ids, self.model.config.vocab_size,
                                     mask_prob=self.hparams.mask_prob, attention_mask=mask,
                                     generator=generator)
        logits = self.model.mlm_logits(self.model(masked, attention_mask=mask))
        return mlm_loss(logits, labels), logits, labels

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss, _, _ = self.step(batch)
        self.log_train("train/loss", loss, prog_bar=True)
        return loss

    def _eval(self, batch: dict[str, Tensor], batch_idx: int, split: str) -> None:
        gen = torch.Generator(device=batch["input_ids"].device).manual_seed(batch_idx)
        loss, logits, labels = self.step(batch, gen)
        chosen = labels != IGNORE_INDEX
        n = int(chosen.sum())
        if n == 0:
            return
        acc = (logits.argmax(-1)[chosen] == labels[chosen]).float().mean()
        self.log_mean(f"{split}/loss", loss, n, prog_bar=True)
        self.log_mean(f"{split}/acc", acc, n, prog_bar=True)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval(batch, batch_idx, "val")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval(batch, batch_idx, "test")

    def on_train_end(self) -> None:
        if self.hparams.save_dir and self.trainer.is_global_zero:
            path = self.model.save_pretrained(self.hparams.save_dir)
            print(f"encoder saved to {path}")


def load_encoder_weights(model: TextEncoder, path: str | Path) -> list[str]:
    """Copy the weights of a saved encoder (a ``save_pretrained`` folder) into ``model``,
    leaving out heads absent or shaped differently there (a new classifier, say).

    Every embedding and backbone weight must be present with the right shape. Returns the
    names of the parameters that were *not* loaded.
    """
    # rebuild the saved model, so that weights stored once for tied names (the MLM decoder
    # and the token embedding) come back under every name
    state = from_pretrained(Path(path)).state_dict()
    own = model.state_dict()
    loaded = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    needed = [k for k in own if k.startswith(("tok_embed", "pos_embed", "transformer"))
              and k not in loaded]
    if needed:
        raise ValueError(f"{path} does not fit this encoder; missing or mis-shaped: "
                         f"{', '.join(needed[:8])}{' ...' if len(needed) > 8 else ''}")
    model.load_state_dict(loaded, strict=False)
    return [k for k in own if k not in loaded]


class SequenceClassificationTask(ClassificationTask):
    """Deprecated: a text classifier is a :class:`~multimodal.tasks.classification.
    ClassificationTask` over a :class:`TextEncoder` (give it ``pretrained: FOLDER`` where
    this task took ``init_from``). Kept so that configs and checkpoints naming it still
    load and train as before: its defaults (``optimizer: {lr: 5e-4, weight_decay: 0.01,
    warmup_fraction: 0.1}``) and ``init_from`` (a ``save_pretrained`` folder whose encoder
    weights are loaded into ``model`` or the ``preset``'s model). Stored checkpoints are
    mapped onto ClassificationTask by :func:`multimodal.tasks.stored_task`."""

    accepts = (TextEncoder,)
    optimizer_defaults = OptimizerConfig(lr=5e-4, weight_decay=0.01,
                                         warmup_fraction=0.1, min_lr_ratio=0.01)

    def __init__(
        self,
        model: TextEncoder | None = None,
        init_from: str | None = None,
        modality: Literal["text"] = "text",
        **kwargs: Any,
    ) -> None:
        warnings.warn("SequenceClassificationTask is deprecated: use multimodal.tasks."
                      "ClassificationTask (with pretrained: FOLDER in place of init_from)",
                      DeprecationWarning, stacklevel=2)
        if model is not None and not isinstance(model, TextEncoder):
            raise ValueError(f"model must be a TextEncoder, got {type(model).__name__}")
        if init_from:
            if kwargs.get("preset") is not None:  # built here, so that the weights go into it
                model, _ = self.model_from(model, pretrained=kwargs.get("pretrained"),
                                           preset=kwargs["preset"],
                                           overrides=kwargs.get("overrides"),
                                           data_sizes=kwargs.get("data_sizes"))
                kwargs.update(preset=None, overrides=None)
            if model is None:
                raise ValueError("init_from loads weights into a model: give model or "
                                 "preset, or use pretrained: PATH alone")
            load_encoder_weights(model, init_from)
        super().__init__(model, modality=modality, **kwargs)
