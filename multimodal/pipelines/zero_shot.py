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
from multimodal.pipelines.embed import encode_batch, load_model_encoder
from multimodal.pipelines.inputs import Reader, Skipped, collect_inputs, read_batch
from multimodal.progress import progress

__all__ = ["DEFAULT_TEMPLATES", "ZeroShotRow", "class_embeddings", "zero_shot"]

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


def zero_shot(model: Any, inputs: Any, labels: Sequence[str],
              templates: Sequence[str] = DEFAULT_TEMPLATES, *, batch_size: int = 32,
              skip_corrupt: bool = False, activation: str | None = None,
              stream: IO[str] | None = None) -> list[ZeroShotRow]:
    """Zero-shot classify images with a CLIP / SigLIP model. The logits are
    ``s · I Cᵀ (+ b)`` (``I`` the unit image embeddings, ``C`` :func:`class_embeddings`,
    ``s = exp(logit_scale)``, ``b`` SigLIP's bias); the probabilities their softmax over the
    labels for CLIP, and for SigLIP (trained with the sigmoid loss) each label's own
    ``sigmoid``, as transformers' zero-shot pipeline gives them (``activation`` =
    ``"softmax"`` / ``"sigmoid"`` overrides)."""
    labels = [str(x).strip() for x in labels if str(x).strip()]
    if len(labels) < 2:
        raise ValueError(f"give at least two labels, got {labels}")
    if not templates:
        raise ValueError("give at least one template")
    encoder = load_model_encoder(model)
    if encoder.modality != "image+text":
        raise ValueError(f"zero-shot needs a CLIP / SigLIP (image+text) model; "
                         f"{model if isinstance(model, (str, Path)) else 'the model'} is a "
                         f"{type(encoder.backbone).__name__} (modality {encoder.modality})")
    clip = encoder.backbone
    activation = activation or ("sigmoid" if clip.config.loss == "sigmoid" else "softmax")
    if activation not in ("softmax", "sigmoid"):
        raise ValueError(f"activation must be 'softmax' or 'sigmoid', got {activation!r}")
    stream = stream if stream is not None else sys.stderr
    with torch.no_grad():
        classes = class_embeddings(encoder, labels, templates)
        scale = clip.scale().float().cpu()
        bias = clip.logit_bias.float().cpu() if clip.logit_bias is not None else 0.0
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
                    logits = scale * F.normalize(emb.float(), dim=-1) @ classes.cpu().T + bias
                    probs = logits.softmax(dim=-1) if activation == "softmax" \
                        else logits.sigmoid()
                    for item, p in zip(kept, probs, strict=True):
                        top = int(p.argmax())
                        rows.append(ZeroShotRow(item.id, labels[top], float(p[top]),
                                                tuple(float(v) for v in p)))
            bar.update(len(chunk))
    skipped.report(stream)
    return rows
