"""Pixel-by-pixel image generation (ImageGPT): next-pixel cross-entropy and bits/dim.

Loss: ``L = -1/N sum_n log p(x_n | x_<n)`` per image (nats per pixel), whose value in
bits, ``L / ln 2``, is the bits per dimension reported for train, val and test. The
bits/dim are those of the *tokenised* images: with ``vocab_size = 256`` grey levels the
8-bit pixels themselves; with fewer levels, the quantised pixels (state it so).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

from multimodal.models.image_gpt import ImageGPT
from multimodal.tasks.base import ModelTask
from multimodal.tasks.optim import OptimizerConfig
from multimodal.tokenizers.image import PixelTokenizer

__all__ = ["AutoregressiveImageTask"]


def evenly_spaced_items(dataset: Dataset, num: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images and labels of ``num`` ``(image, label)`` items at indices
    ``round(linspace(0, len - 1, num))`` (repeats dropped), so a split stored class by
    class still gives every class."""
    if len(dataset) == 0:
        raise ValueError("the dataset is empty")
    index = torch.linspace(0, len(dataset) - 1, num).round().long().unique()
    items = [dataset[int(i)] for i in index]
    images = torch.stack([torch.as_tensor(x) for x, _ in items])
    return images, torch.tensor([int(y) for _, y in items])


class AutoregressiveImageTask(ModelTask):
    """Train an :class:`ImageGPT` on batches ``(images uint8 (B, 1, H, W), labels)`` from
    :class:`multimodal.data.pixels.PixelDataModule`.

    Grey pixels are tokenised with ``PixelTokenizer(levels=model.config.vocab_size)``
    (256 levels: the token is the pixel value). A class-conditional model
    (``num_classes > 0``) gets the labels as its start tokens. AdamW with warm-up +
    cosine. At the end of ``fit`` a grid of ``num_samples`` samples is written to
    ``samples.png`` in the run's log folder (``samples_completion.png``: the top halves of
    validation images completed by the model).
    """

    accepts = (ImageGPT,)
    optimizer_defaults = OptimizerConfig(lr=1e-3, weight_decay=0.05,
                                         warmup_fraction=0.05, min_lr_ratio=0.01)
    model_sources = ("model", "preset")

    default_monitor = ("val/bpd", "min")  # the CLI's default ModelCheckpoint ranks by it

    def __init__(
        self,
        model: ImageGPT | None = None,
        num_samples: int = 16,
        sample_temperature: float = 1.0,
        sample_top_k: int | None = None,
        sample_seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, pretrained=None, **kwargs)  # model_sources: no pretrained
        model = self.model
        self.save_hyperparameters(ignore=["model"])
        self.tokenizer = PixelTokenizer(levels=model.config.vocab_size) \
            if model.config.vocab_size <= 256 else None
        self._val_images: Tensor | None = None

    def setup(self, stage: str) -> None:
        dm = self.datamodule
        if dm is None:
            return
        h, w = self.model.config.grid
        size = getattr(dm, "image_size", None)
        if size is not None and (size, size) != (h, w):
            raise ValueError(f"the data gives {size}x{size} images but the model is built for "
                             f"{h}x{w}: set the model's image_size or the data's image_size")
        names = getattr(dm, "class_names", None)  # the data-module contract
        n = len(names) if names else None
        k = self.model.config.num_classes
        if k and n is not None and n != k:
            raise ValueError(f"the data has {n} classes but the model has {k} class tokens")

    # -- steps -----------------------------------------------------------------------
    def tokens(self, images: Tensor) -> Tensor:
        """uint8 (B, 1, H, W) images -> (B, H*W) pixel tokens in raster order."""
        if self.tokenizer is None:
            raise ValueError("vocab_size > 256: pass pre-tokenised images (a palette model)")
        return self.tokenizer.encode(images, flatten=True)

    def _nll(self, batch: Any) -> Tensor:
        """Mean next-pixel negative log-likelihood in nats."""
        images, labels = batch
        tokens = self.tokens(images)
        cls = labels if self.model.config.num_classes else None
        logits = self.model(tokens[:, :-1], class_label=cls)
        return F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = self._nll(batch)
        self.log_train("train/loss", loss, prog_bar=True)
        self.log_train("train/bpd", loss / math.log(2), prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if self._val_images is None:
            self._val_images = batch[0][: self.hparams.num_samples].detach()
            self._val_labels = batch[1][: self.hparams.num_samples].detach()
        loss = self._nll(batch)
        self.log_mean("val/loss", loss, len(batch[0]), prog_bar=True)
        self.log_mean("val/bpd", loss / math.log(2), len(batch[0]), prog_bar=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        loss = self._nll(batch)
        self.log_mean("test/loss", loss, len(batch[0]))
        self.log_mean("test/bpd", loss / math.log(2), len(batch[0]), prog_bar=True)

    # -- samples ---------------------------------------------------------------------
    def sample_images(self, num: int, prompt_rows: int = 0,
                      prompts: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """``num`` samples as uint8 (num, 1, H, W); with ``prompt_rows`` the top rows of
        ``prompts`` (images, labels; default :meth:`_prompt_images`) are given and the
        rest completed."""
        gen = torch.Generator(device=self.device).manual_seed(self.hparams.sample_seed)
        kw: dict[str, Any] = dict(do_sample=True, temperature=self.hparams.sample_temperature,
                                  top_k=self.hparams.sample_top_k, generator=gen)
        if prompt_rows:
            prompts = prompts if prompts is not None else self._prompt_images(num)
            if prompts is None:
                raise ValueError("no validation images to take prompts from: run fit or "
                                 "validate with a validation split first")
            images, labels = prompts
            rows = self.tokens(images)[:, : prompt_rows * self.model.config.grid[1]]
            cls = labels if self.model.config.num_classes else None
            tokens = self.model.generate(prompt=rows, class_label=cls, **kw)
        else:
            tokens = self.model.generate(num_images=num, **kw)
        return self.tokenizer.decode(tokens)[:, None]

    def _prompt_images(self, num: int) -> tuple[Tensor, Tensor] | None:
        """``num`` validation images and labels to complete: evenly spaced over the whole
        validation split when the data module gives one (a split stored class by class
        would otherwise give one class only), else the first validation batch."""
        dm = self.datamodule
        split_dataset = getattr(dm, "split_dataset", None)
        dataset = split_dataset("val") if callable(split_dataset) else None
        if dataset is not None and len(dataset) > 0:
            images, labels = evenly_spaced_items(dataset, num)
            return images.to(self.device), labels.to(self.device)
        if self._val_images is None:
            return None
        return self._val_images[:num], self._val_labels[:num]

    def on_fit_end(self) -> None:
        folder = self.trainer.log_dir or self.trainer.default_root_dir
        if not self.trainer.is_global_zero or not folder or self.tokenizer is None:
            return
        from torchvision.utils import make_grid, save_image

        num = self.hparams.num_samples
        nrow = max(1, int(math.sqrt(num)))
        outputs = {"samples.png": self.sample_images(num)}
        prompts = self._prompt_images(num)
        if prompts is not None:
            half = self.model.config.grid[0] // 2
            outputs["samples_completion.png"] = self.sample_images(num, half, prompts)
        for name, images in outputs.items():
            path = Path(folder) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            save_image(make_grid(images.float() / 255.0, nrow=nrow, padding=1), str(path))
            print(f"samples: {path}")

