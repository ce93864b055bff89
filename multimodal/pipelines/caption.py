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
from multimodal.loading import load
from multimodal.models.captioner import Captioner, decode_captions
from multimodal.pipelines.inputs import (
    Reader,
    Skipped,
    UnreadableInput,
    collect_inputs,
    measured_image_preprocessor,
    read_batch,
)
from multimodal.progress import progress

# load_captioner: the verb's picker of load(path), not an entry point (mm.caption takes a path)
__all__ = ["CaptionerBundle", "caption"]


@dataclass
class CaptionerBundle:
    """A captioner with what turns files into its inputs and ids into strings."""

    model: Captioner
    tokenizer: Any
    preprocessor: ImagePreprocessor


def load_captioner(path: str | Path, *, image_size: int | None = None,
                   mean: Sequence[float] | None = None, std: Sequence[float] | None = None
                   ) -> CaptionerBundle:
    """A captioner from a ``CaptioningTask`` checkpoint (its tokenizer travels in it; the
    image normalisation comes from the run's data module) or a folder (a Hugging Face
    ``VisionEncoderDecoder`` layout with ``tokenizer.json`` and
    ``preprocessor_config.json``, or one written by ``save_pretrained`` with a
    ``tokenizer.json``): the parts of :func:`multimodal.loading.load`. ``image_size`` /
    ``mean`` / ``std`` override the preprocessing."""
    loaded = load(path)
    model, path = loaded.model, loaded.path
    _check_captioner(model, path)
    if loaded.tokenizer is None:
        raise ValueError(f"{path} holds no tokenizer (a CaptioningTask checkpoint saves it "
                         "under 'tokenizer'; a folder needs tokenizer.json): the captions "
                         "cannot be decoded")
    preprocessor = loaded.preprocessor
    overridden = image_size is not None and mean is not None and std is not None
    if preprocessor is None and not overridden:
        if loaded.kind != "checkpoint":
            raise ValueError(f"{path} has no preprocessor_config.json: give --image_size, "
                             "--mean and --std")
        preprocessor = measured_image_preprocessor(loaded.data_class, loaded.data_arguments, path,
                                                model.config.encoder.in_channels)
    if image_size is not None or mean is not None or std is not None:
        channels = model.config.encoder.in_channels
        base = preprocessor
        preprocessor = ImagePreprocessor(
            size=image_size if image_size is not None else base.size,
            image_mean=mean if mean is not None else base.mean.tolist(),
            image_std=std if std is not None else base.std.tolist(), channels=channels)
    return CaptionerBundle(model.eval(), loaded.tokenizer, preprocessor)


def _check_captioner(model: Any, path: Path) -> None:
    if not isinstance(model, Captioner):
        raise ValueError(f"{path} holds a {type(model).__name__}, not a captioner (a "
                         "CaptioningTask checkpoint or a VisionEncoderDecoder folder)")


def caption(model: Any, inputs: Any, *, batch_size: int = 16, skip_corrupt: bool = False,
            stream: IO[str] | None = None, **generate_kwargs: Any) -> list[tuple[str, str]]:
    """``(id, caption)`` of every image; ``model`` is a :class:`CaptionerBundle` or what
    :func:`load_captioner` reads. Decoding: ``Captioner.generate`` (greedy by default;
    ``num_beams``, ``max_new_tokens``, ... pass through)."""
    bundle = model if isinstance(model, CaptionerBundle) else load_captioner(model)
    items = collect_inputs(inputs, ("image",))
    stream = stream if stream is not None else sys.stderr
    skipped = Skipped()
    reader = Reader(channels=bundle.preprocessor.channels)
    captioner = bundle.model
    device = next(captioner.parameters()).device
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
                    ids = captioner.generate(torch.stack(pixels).to(device), **generate_kwargs)
                texts = decode_captions(ids[:, 1:].cpu(), bundle.tokenizer,
                                        captioner.config.eos_token_id)
                out += [(item.id, text.strip()) for item, text in zip(good, texts, strict=True)]
            bar.update(len(chunk))
    skipped.report(stream)
    return out
