"""A Hugging Face folder's ``preprocessor_config.json`` -> the input pipeline of our model.

Audio (``feature_extractor_type``): ``ASTFeatureExtractor`` and ``WhisperFeatureExtractor``
set the statistics of the converted model's front end (``model.tokenizer``) and are checked
against it (sampling rate, mel bins, frames, FFT and hop): a folder whose extractor does not
fit its model is an error naming the field, never a silent mismatch.

Images (``image_processor_type``: ViT, DeiT, BiT / DINOv2, CLIP processors and the like):
:class:`ImagePreprocessor` with the folder's size, resize mode, crop, rescale factor and
mean/std. It follows transformers' default (torchvision) image processors: the image as a
``uint8`` tensor, ``resize`` with antialiasing (to ``(height, width)``, or the shorter side
to ``shortest_edge`` keeping the aspect ratio: the longer side becomes
``int(shortest_edge * long / short)``), a centre crop with floored offsets and zero padding
(:mod:`multimodal.tokenizers.image_geometry`: torchvision's ``center_crop`` rounds them and
would shift the window by a pixel on many photos), then ``(x * rescale_factor - mean) /
std`` per channel.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from multimodal.files import read_image
from multimodal.tokenizers.image_geometry import center_crop, shortest_edge_size

PREPROCESSOR_NAME = "preprocessor_config.json"
AUDIO_EXTRACTORS = ("ASTFeatureExtractor", "WhisperFeatureExtractor")

# PIL's resample codes (as transformers stores them) -> torchvision's interpolation names
_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def read_preprocessor_config(folder: str | Path) -> dict[str, Any] | None:
    """The folder's ``preprocessor_config.json`` as a dict, or None when there is none."""
    file = Path(folder) / PREPROCESSOR_NAME
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{file} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file}: expected a JSON object")
    return data


def _check(file: str, pairs: dict[str, tuple[Any, Any]]) -> None:
    bad = {k: v for k, v in pairs.items() if v[0] is not None and v[0] != v[1]}
    if bad:
        detail = ", ".join(f"{k}={theirs!r} but the model has {ours!r}"
                           for k, (theirs, ours) in bad.items())
        raise ValueError(f"{file} does not fit the model: {detail}")


def apply_audio_preprocessor(model: Any, pre: dict[str, Any],
                             file: str = PREPROCESSOR_NAME) -> None:
    """Check ``pre`` (an audio feature extractor's config) against the converted
    :class:`~multimodal.AudioClassifier` and set its front end's normalisation."""
    kind = pre.get("feature_extractor_type")
    c = model.config
    if kind == "ASTFeatureExtractor":
        _check(file, {"frontend": ("kaldi_fbank", c.frontend),
                      "sampling_rate": (pre.get("sampling_rate"), c.sample_rate),
                      "num_mel_bins": (pre.get("num_mel_bins"), c.n_mels),
                      "max_length": (pre.get("max_length"), c.max_frames)})
        from multimodal.tokenizers.audio_frontends import AST_MEAN, AST_STD
        if pre.get("do_normalize", True):
            mean, std = float(pre.get("mean", AST_MEAN)), 2.0 * float(pre.get("std", AST_STD))
        else:
            mean, std = 0.0, 1.0
    elif kind == "WhisperFeatureExtractor":
        rate = pre.get("sampling_rate", c.sample_rate)
        hop = pre.get("hop_length", 160)
        chunk = pre.get("chunk_length")
        _check(file, {"frontend": ("whisper", c.frontend),
                      "sampling_rate": (rate, c.sample_rate),
                      "feature_size": (pre.get("feature_size"), c.n_mels),
                      "n_fft": (pre.get("n_fft"), model.tokenizer.config.n_fft),
                      "hop_length": (hop, model.tokenizer.config.hop_length),
                      "chunk_length * sampling_rate / hop_length":
                          (None if chunk is None else chunk * rate // hop, c.max_frames)})
        if float(pre.get("dither", 0.0)) != 0.0:
            raise ValueError(f"{file}: dither={pre['dither']} (random noise) is not supported")
        mean, std = -4.0, 4.0
    else:
        raise ValueError(f"{file}: unsupported feature_extractor_type {kind!r} for an audio "
                         f"model; supported: {', '.join(AUDIO_EXTRACTORS)}")
    with torch.no_grad():
        model.tokenizer.mean.fill_(mean)
        model.tokenizer.std.fill_(std)
        model.tokenizer.fitted.fill_(True)


class ImagePreprocessor:
    """Images (paths, PIL images or ``uint8`` tensors ``(3, H, W)``) -> a float
    batch ``(B, 3, H', W')`` as a transformers image processor of the same settings gives.

    ``size``: ``{"height": h, "width": w}`` or ``{"shortest_edge": s}``; ``crop_size``:
    ``{"height", "width"}`` (used when ``do_center_crop``); ``resample``: PIL's code
    (2 bilinear, 3 bicubic, ...); ``channels``: 3 (RGB, the processors of Hugging Face
    folders) or 1 (grey, for models trained here on grey images).
    """

    def __init__(self, size: dict[str, int] | int | None = None, resample: int = 2,
                 do_resize: bool = True, do_center_crop: bool = False,
                 crop_size: dict[str, int] | int | None = None, do_rescale: bool = True,
                 rescale_factor: float = 1 / 255, do_normalize: bool = True,
                 image_mean: Sequence[float] = (0.5, 0.5, 0.5),
                 image_std: Sequence[float] = (0.5, 0.5, 0.5), channels: int = 3) -> None:
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 (grey) or 3 (RGB), got {channels}")
        self.channels = channels
        if resample not in _RESAMPLE:
            raise ValueError(f"unsupported resample={resample!r}; supported PIL codes: "
                             f"{_RESAMPLE}")
        self.size = {"height": size, "width": size} if isinstance(size, int) else dict(size or {})
        if do_resize and not ({"height", "width"} <= set(self.size)
                              or "shortest_edge" in self.size):
            raise ValueError(f"size must give height and width or shortest_edge, got {size!r}")
        crop = {"height": crop_size, "width": crop_size} if isinstance(crop_size, int) \
            else dict(crop_size or {})
        if do_center_crop and not {"height", "width"} <= set(crop):
            raise ValueError(f"crop_size must give height and width, got {crop_size!r}")
        self.crop_size, self.resample = crop, resample
        self.do_resize, self.do_center_crop = do_resize, do_center_crop
        self.do_rescale, self.rescale_factor = do_rescale, float(rescale_factor)
        self.do_normalize = do_normalize
        self.mean = torch.tensor([float(m) for m in image_mean])
        self.std = torch.tensor([float(s) for s in image_std])

    @classmethod
    def from_dict(cls, pre: dict[str, Any]) -> ImagePreprocessor:
        """From a ``preprocessor_config.json``'s settings (``num_channels``: 1 for a grey
        model, written by :meth:`to_dict`; a Hugging Face folder's are RGB)."""
        keys = ("size", "resample", "do_resize", "do_center_crop", "crop_size", "do_rescale",
                "rescale_factor", "do_normalize", "image_mean", "image_std")
        channels = pre.get("num_channels", 3)
        return cls(**{k: pre[k] for k in keys if k in pre and pre[k] is not None},
                   channels=channels if channels in (1, 3) else 3)

    def to_dict(self) -> dict[str, Any]:
        """The settings as a ``preprocessor_config.json`` that :meth:`from_dict` and
        transformers' ``ViTImageProcessor`` read (``num_channels`` only for a grey model)."""
        out: dict[str, Any] = {
            "image_processor_type": "ViTImageProcessor", "do_resize": self.do_resize,
            "size": self.size, "resample": self.resample,
            "do_center_crop": self.do_center_crop, "do_rescale": self.do_rescale,
            "rescale_factor": self.rescale_factor, "do_normalize": self.do_normalize,
            "image_mean": self.mean.tolist(), "image_std": self.std.tolist()}
        if self.do_center_crop:
            out["crop_size"] = self.crop_size
        if self.channels != 3:
            out["num_channels"] = self.channels
        return out

    def save(self, folder: str | Path) -> Path:
        """Write :meth:`to_dict` as ``folder/preprocessor_config.json``; returns the file."""
        file = Path(folder) / PREPROCESSOR_NAME
        file.write_text(json.dumps(self.to_dict(), indent=2))
        return file

    def _load(self, image: Any) -> Tensor:
        if isinstance(image, Tensor):
            if image.dtype != torch.uint8 or image.dim() != 3 or image.shape[0] != self.channels:
                raise ValueError(f"image tensors must be uint8 ({self.channels}, H, W), got "
                                 f"{image.dtype} {tuple(image.shape)}")
            return image
        try:  # a path or a PIL image: the one image reader (EXIF orientation, channels)
            return read_image(image, self.channels)
        except TypeError:
            raise ValueError(f"expected an image path, a PIL image or a uint8 tensor, got "
                             f"{type(image).__name__}") from None

    def _resize(self, x: Tensor) -> Tensor:
        from torchvision.transforms.v2 import InterpolationMode
        from torchvision.transforms.v2 import functional as tvf

        if "shortest_edge" in self.size:
            new = shortest_edge_size(*x.shape[-2:], int(self.size["shortest_edge"]))
        else:
            new = (int(self.size["height"]), int(self.size["width"]))
        mode = InterpolationMode(_RESAMPLE[self.resample])
        if mode == InterpolationMode.LANCZOS:
            mode = InterpolationMode.BICUBIC  # as transformers' torchvision backend does
        return tvf.resize(x, list(new), interpolation=mode, antialias=True)

    def _rescale_and_normalize(self, x: Tensor) -> Tensor:
        """``(x * r - mean) / std``, computed as transformers does it, fused:
        ``(x - mean / r) / (std / r)`` with ``mean / r`` and ``std / r`` rounded to float32
        first, so the result is the processor's to the last bit."""
        if self.do_rescale and self.do_normalize:
            scale = 1.0 / self.rescale_factor
            mean, std = self.mean * scale, self.std * scale
            return (x - mean[:, None, None]) / std[:, None, None]
        if self.do_rescale:
            return x * self.rescale_factor
        if self.do_normalize:
            return (x - self.mean[:, None, None]) / self.std[:, None, None]
        return x

    def __call__(self, images: Any) -> Tensor:
        if not isinstance(images, (list, tuple)):
            images = [images]
        out = []
        for image in images:
            x = self._load(image)
            if self.do_resize:
                x = self._resize(x)
            if self.do_center_crop:
                x = center_crop(x, (self.crop_size["height"], self.crop_size["width"]))
            out.append(self._rescale_and_normalize(x.float()))
        shapes = {tuple(x.shape) for x in out}
        if len(shapes) > 1:
            raise ValueError(f"images of different sizes after preprocessing: {sorted(shapes)}")
        return torch.stack(out)


def data_image_preprocessor(data: Any, *, channels: int | None = None,
                            image_size: int | None = None) -> ImagePreprocessor | None:
    """The one map from an image data module's settings to the :class:`ImagePreprocessor`
    that resizes, crops and normalises as its evaluation transform does
    (:func:`multimodal.data.vision_transforms.image_transform` with ``train=False``), so
    ``predict``, ``embed``, ``zero-shot``, ``caption`` and ``serve`` read images as ``fit``
    did. Used where a model is saved (``save_pretrained`` of a task: the live data module)
    and where a checkpoint loads (its recorded data arguments, once).

    ``data``: the data module's arguments (a mapping, as a checkpoint records them under
    ``datamodule_hyper_parameters``) or the data module itself (its attributes: then
    ``mean`` / ``std`` are the statistics it measured on the training images). Read:

    * ``image_size``: the square side (else ``image_size`` given here, the model's);
    * ``resize``: the shorter side is resized to it (aspect kept), then a centre crop of
      ``image_size``; without it, a resize to ``image_size x image_size``;
    * ``interpolation``: ``"bilinear"`` (default), ``"bicubic"``, ... (PIL's codes in the
      processor);
    * ``mean`` / ``std``: one value or one per channel, of pixels scaled to [0, 1]:
      ``x = (pixel / 255 - mean) / std``;
    * ``in_channels``: 1 or 3 (``channels`` given here wins: the model's).

    None when the data do not say it all: no ``mean`` / ``std`` (a data module measures
    them at ``setup``; a checkpoint's arguments then hold none), no size, statistics that
    cannot be read, or channels other than 1 and 3."""
    def get(key: str) -> Any:
        if isinstance(data, dict):
            return data.get(key)
        try:
            return getattr(data, key, None)
        except (RuntimeError, ValueError, TypeError, OSError):  # statistics not measurable
            return None

    size = get("image_size") or image_size
    channels = channels or get("in_channels") or 3
    mean, std = get("mean"), get("std")
    if not isinstance(size, int) or channels not in (1, 3) or mean is None or std is None:
        return None

    def per_channel(value: Any) -> list[float]:
        values = [float(value)] if isinstance(value, (int, float)) else [float(v) for v in value]
        return values * channels if len(values) == 1 else values

    resize = get("resize")
    codes = {name: code for code, name in _RESAMPLE.items()}
    return ImagePreprocessor(
        size={"shortest_edge": int(resize)} if resize else size,
        resample=codes.get(get("interpolation") or "bilinear", 2),
        do_center_crop=bool(resize), crop_size=size if resize else None,
        image_mean=per_channel(mean), image_std=per_channel(std), channels=channels)
