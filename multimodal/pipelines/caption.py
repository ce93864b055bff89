"""``mm.caption`` / ``multimodal caption``: a caption per image of a folder or manifest
(:mod:`multimodal.pipelines.inputs`), with a captioner picked from :func:`multimodal.load`."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from multimodal.convert.hf_preprocess import ImagePreprocessor
from multimodal.models.captioner import Captioner, decode_captions
from multimodal.moved import old_names
from multimodal.pipelines._loaders import captioner
from multimodal.pipelines.inputs import Reader, Skipped, UnreadableInput, collect_inputs, read_batch
from multimodal.progress import progress

__all__ = ["CaptionerBundle", "caption"]


@dataclass
class CaptionerBundle:
    """A captioner with what turns files into its inputs and ids into strings."""

    model: Captioner
    tokenizer: Any
    preprocessor: ImagePreprocessor


def _load_captioner(path: str | Path, *, image_size: int | None = None,
                    mean: Sequence[float] | None = None, std: Sequence[float] | None = None
                    ) -> CaptionerBundle:
    """What the deprecated ``load_captioner`` gives: :class:`CaptionerBundle` of ``path``."""
    return CaptionerBundle(*captioner(path, image_size=image_size, mean=mean, std=std))


__getattr__ = old_names(__name__, {
    "load_captioner": (lambda: _load_captioner,
                       "multimodal.caption(multimodal.load(path), images) (image_size / mean / "
                       "std: keywords of caption)")})


def caption(model: Any, inputs: Any, *, batch_size: int = 16, skip_corrupt: bool = False,
            stream: IO[str] | None = None, image_size: int | None = None,
            mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
            **generate_kwargs: Any) -> list[tuple[str, str]]:
    """``(id, caption)`` of every image. ``model``: a :class:`CaptionerBundle`, or a path /
    what :func:`multimodal.load` returned for it: a ``CaptioningTask`` checkpoint (its
    tokenizer travels in it; the image normalisation comes from the run's data module) or a
    folder (a Hugging Face ``VisionEncoderDecoder`` layout with ``tokenizer.json`` and
    ``preprocessor_config.json``, or one written by ``save_pretrained`` with a
    ``tokenizer.json``); ``image_size`` / ``mean`` / ``std`` override its preprocessing.
    Decoding: ``Captioner.generate`` (greedy by default; ``num_beams``,
    ``max_new_tokens``, ... pass through)."""
    overrides = {"image_size": image_size, "mean": mean, "std": std}
    if isinstance(model, CaptionerBundle):
        if any(v is not None for v in overrides.values()):
            raise ValueError("image_size / mean / std apply to a model path or what "
                             "multimodal.load returned; a CaptionerBundle has its preprocessor")
        bundle = model
    else:
        bundle = CaptionerBundle(*captioner(model, **overrides))
    items = collect_inputs(inputs, ("image",))
    stream = stream if stream is not None else sys.stderr
    skipped = Skipped()
    reader = Reader(channels=bundle.preprocessor.channels)
    net = bundle.model
    device = next(net.parameters()).device
    out: list[tuple[str, str]] = []
    with progress(total=len(items), desc="caption", unit="images", stream=stream) as bar:
        for start in range(0, len(items), batch_size):
            chunk = items[start:start + batch_size]
            kept, values = read_batch(chunk, "image", reader, skip_corrupt, skipped)
            pixels, good = [], []
            for item, value in zip(kept, values, strict=True):
                try:
                    pixels.append(bundle.preprocessor([value])[0])
                    good.append(item)
                except ValueError as err:
                    if not skip_corrupt:
                        raise UnreadableInput(f"{item.where}: {err}") from None
                    skipped.add(item, f"{item.where}: {err}")
            if pixels:
                with torch.no_grad():
                    ids = net.generate(torch.stack(pixels).to(device), **generate_kwargs)
                texts = decode_captions(ids[:, 1:].cpu(), bundle.tokenizer,
                                        net.config.eos_token_id)
                out += [(item.id, text.strip()) for item, text in zip(good, texts, strict=True)]
            bar.update(len(chunk))
    skipped.report(stream)
    return out
