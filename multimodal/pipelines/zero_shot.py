"""``mm.zero_shot`` / ``multimodal zero-shot``: images classified by a CLIP / SigLIP against
label texts, over a folder or manifest (:mod:`multimodal.pipelines.inputs`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch
import torch.nn.functional as F

from multimodal.encoder import Encoder
from multimodal.pipelines._loaders import model_encoder
from multimodal.pipelines.embed import encode_batch
from multimodal.pipelines.inputs import Reader, Skipped, collect_inputs, read_batch
from multimodal.progress import progress

__all__ = ["DEFAULT_TEMPLATES", "ZeroShotClasses", "ZeroShotRow", "class_embeddings", "zero_shot"]

DEFAULT_TEMPLATES = ("a photo of a {}.",)


@dataclass(frozen=True)
class ZeroShotRow:
    """One input's class probabilities (labels in the given order) and its top label."""

    id: str
    label: str
    probability: float
    probabilities: tuple[float, ...]


def class_embeddings(encoder: Encoder, labels: Sequence[str],
                     templates: Sequence[str]) -> torch.Tensor:
    """One unit vector per label ``(C, D)``: the mean of the unit text embeddings of
    ``template.format(label)`` over the templates, renormalised (CLIP's prompt
    ensembling, as :meth:`multimodal.CLIP.class_embeddings`)."""
    for t in templates:
        if "{}" not in t:
            raise ValueError(f"template {t!r} has no '{{}}' where the label goes")
    texts = [t.format(label) for label in labels for t in templates]
    emb = F.normalize(encoder.encode(texts, modality="text").float(), dim=-1)
    return F.normalize(emb.view(len(labels), len(templates), -1).mean(1), dim=-1)


@dataclass(frozen=True)
class ZeroShotClasses:
    """The text side of zero-shot for one label set, computed once and applied to any
    number of images: the class embeddings ``C`` (:func:`class_embeddings`), the scale
    ``s = exp(logit_scale)``, SigLIP's bias ``b`` (0 for CLIP) and the ``activation``.
    :meth:`probabilities` of image embeddings ``I`` is ``softmax(s · Î Cᵀ + b)`` over the
    labels (CLIP) or each label's ``sigmoid(s · Î Cᵀ + b)`` (SigLIP), ``Î`` the unit rows of
    ``I``: what :func:`zero_shot` and the server's ``/v1/zero-shot`` compute."""

    labels: tuple[str, ...]
    classes: torch.Tensor  # (C, D) unit rows, on the CPU
    scale: torch.Tensor
    bias: torch.Tensor | float
    activation: str

    @classmethod
    def of(cls, encoder: Encoder, labels: Sequence[str],
           templates: Sequence[str] = DEFAULT_TEMPLATES,
           activation: str | None = None) -> ZeroShotClasses:
        """The label set's classes for ``encoder`` (a CLIP / SigLIP); ``activation``
        defaults to ``sigmoid`` for a model trained with the sigmoid loss, else ``softmax``
        (as transformers' zero-shot pipeline)."""
        if encoder.modality != "image+text":
            raise ValueError(f"zero-shot needs a CLIP / SigLIP (image+text) model, not a "
                             f"{type(encoder.backbone).__name__} (modality {encoder.modality})")
        clip = encoder.backbone
        activation = activation or ("sigmoid" if clip.config.loss == "sigmoid" else "softmax")
        if activation not in ("softmax", "sigmoid"):
            raise ValueError(f"activation must be 'softmax' or 'sigmoid', got {activation!r}")
        with torch.no_grad():
            classes = class_embeddings(encoder, labels, templates).cpu()
            scale = clip.scale().float().cpu()
            bias = clip.logit_bias.float().cpu() if clip.logit_bias is not None else 0.0
        return cls(tuple(labels), classes, scale, bias, activation)

    def probabilities(self, images: torch.Tensor) -> torch.Tensor:
        """``(N, C)`` probabilities of image embeddings ``(N, D)`` (class docstring)."""
        logits = self.scale * F.normalize(images.float().cpu(), dim=-1) @ self.classes.T \
            + self.bias
        return logits.softmax(dim=-1) if self.activation == "softmax" else logits.sigmoid()


def zero_shot(model: Any, inputs: Any, labels: Sequence[str],
              templates: Sequence[str] = DEFAULT_TEMPLATES, *, batch_size: int = 32,
              skip_corrupt: bool = False, activation: str | None = None,
              stream: IO[str] | None = None) -> list[ZeroShotRow]:
    """Zero-shot classify images with a CLIP / SigLIP model. The logits are
    ``s · I Cᵀ (+ b)`` (``I`` the unit image embeddings, ``C`` :func:`class_embeddings`,
    ``s = exp(logit_scale)``, ``b`` SigLIP's bias); the probabilities their softmax over the
    labels for CLIP, and for SigLIP (trained with the sigmoid loss) each label's own
    ``sigmoid``, as transformers' zero-shot pipeline gives them (``activation`` =
    ``"softmax"`` / ``"sigmoid"`` overrides); :class:`ZeroShotClasses`."""
    labels = [str(x).strip() for x in labels if str(x).strip()]
    if len(labels) < 2:
        raise ValueError(f"give at least two labels, got {labels}")
    if not templates:
        raise ValueError("give at least one template")
    encoder = model_encoder(model)
    if encoder.modality != "image+text":
        raise ValueError(f"zero-shot needs a CLIP / SigLIP (image+text) model; "
                         f"{model if isinstance(model, (str, Path)) else 'the model'} is a "
                         f"{type(encoder.backbone).__name__} (modality {encoder.modality})")
    head = ZeroShotClasses.of(encoder, labels, templates, activation)
    stream = stream if stream is not None else sys.stderr
    items = collect_inputs(inputs, ("image",))
    skipped, reader = Skipped(), Reader.of(encoder)
    rows: list[ZeroShotRow] = []
    with progress(total=len(items), desc="zero-shot", unit="images", stream=stream) as bar:
        for start in range(0, len(items), batch_size):
            chunk = items[start:start + batch_size]
            kept, values = read_batch(chunk, "image", reader, skip_corrupt, skipped)
            if values:
                kept, emb = encode_batch(encoder, "image", kept, values, skip_corrupt,
                                          skipped)
                if kept:
                    probs = head.probabilities(emb)
                    for item, p in zip(kept, probs, strict=True):
                        top = int(p.argmax())
                        rows.append(ZeroShotRow(item.id, labels[top], float(p[top]),
                                                tuple(float(v) for v in p)))
            bar.update(len(chunk))
    skipped.report(stream)
    return rows
