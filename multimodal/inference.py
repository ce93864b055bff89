"""Inference over folders of inputs: embed, zero-shot classify, caption.

The loops behind ``multimodal embed`` / ``zero-shot`` / ``caption`` (thin command-line
front ends in :mod:`multimodal.cli.inference`), usable from Python as ``mm.embed``,
``mm.zero_shot`` and ``mm.caption``.

Inputs (:func:`collect_inputs`) are a folder, searched recursively in sorted order (images
``.png .jpg .jpeg .webp .bmp .gif``, audio ``.wav .flac .ogg .mp3``, texts ``.txt``: one text
per file), a manifest (``.csv`` / ``.jsonl`` with a ``path`` column, relative to the
manifest's folder, or a ``text`` column; an optional ``id`` column), a ``.txt`` manifest of
one text per line, or a Python list of paths / strings. Every input has an id (its path
relative to the folder, the manifest's ``id``, or ``line N``) that travels with its result.
An input that cannot be read is an error naming it (:class:`UnreadableInput`), or, with
``skip_corrupt``, is left out, reported at the end and recorded in the output.

``embed`` writes ``(N, D)`` float32 embeddings with their ids to ``.safetensors`` (tensor
``embeddings``, the ids in the metadata) or ``.npy`` (the ids in ``<name>.ids.json``
beside it). Work is saved batch by batch in ``<out>.parts/``; a run that is interrupted and
started again with the same ``out`` reads what is there and embeds only the rest (an
``out`` written by another model is refused, never mixed). Inputs are batched and each
embedding is the same whatever it was batched with (:meth:`multimodal.hub.Encoder.encode`).
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch
import torch.nn.functional as F

from multimodal.convert.hf_preprocess import ImagePreprocessor
from multimodal.files import AUDIO_EXTENSIONS, IMAGE_EXTENSIONS, TEXT_EXTENSIONS, path_kind
from multimodal.hub import Encoder, datamodule_arguments, load_encoder, read_checkpoint
from multimodal.loading import load
from multimodal.models.captioner import Captioner, decode_captions
from multimodal.progress import progress
from multimodal.tokenizers.audio import load_audio
from multimodal.weights import save_safetensors

__all__ = [
    "DEFAULT_TEMPLATES", "CaptionerBundle", "InputItem", "UnreadableInput", "ZeroShotClasses",
    "caption", "class_embeddings", "collect_inputs", "embed", "load_captioner",
    "load_model_encoder", "read_embeddings", "zero_shot",
]

DEFAULT_TEMPLATES = ("a photo of a {}.",)
PARTS_SUFFIX = ".parts"
OUTPUT_SUFFIXES = (".safetensors", ".npy")


class UnreadableInput(ValueError):
    """An input that cannot be read; the message names it and why."""


@dataclass(frozen=True)
class InputItem:
    """One input: its ``id`` (kept with its result), a file ``path`` or a ``text``, and
    ``where`` it came from (what an error names)."""

    id: str
    where: str
    path: Path | None = None
    text: str | None = None


# ======================================================================================
# inputs
# ======================================================================================

def _kind_of_file(path: Path) -> str | None:
    suffix = path.suffix.lower()
    if suffix in IMAGE_EXTENSIONS:
        return "image"
    if suffix in AUDIO_EXTENSIONS:
        return "audio"
    if suffix in TEXT_EXTENSIONS:
        return "text"
    return None


def _folder_items(folder: Path, kinds: Sequence[str]) -> list[InputItem]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")
                   and _kind_of_file(p) is not None)
    found = {_kind_of_file(p) for p in files}
    for kind in kinds:  # the first kind the model reads that the folder holds
        if kind in found:
            return [InputItem(p.relative_to(folder).as_posix(), str(p), path=p)
                    for p in files if _kind_of_file(p) == kind]
    wanted = " or ".join({"image": "images (" + " ".join(IMAGE_EXTENSIONS) + ")",
                          "audio": "audio (" + " ".join(AUDIO_EXTENSIONS) + ")",
                          "text": "texts (.txt)"}[k] for k in kinds)
    raise ValueError(f"{folder} holds no {wanted}")


def _manifest_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, row)`` of a CSV (header row) or JSON-lines manifest."""
    rows: list[tuple[int, dict[str, Any]]] = []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot read the manifest ({err})") from None
    if path.suffix.lower() == ".jsonl":
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path} line {n}: not valid JSON ({err})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path} line {n}: expected a JSON object")
            rows.append((n, row))
        return rows
    reader = csv.DictReader(text.splitlines())
    for row in reader:
        rows.append((reader.line_num, dict(row)))
    return rows


def _manifest_items(path: Path) -> list[InputItem]:
    if path.suffix.lower() == ".txt":  # one text per line
        lines = path.read_text(encoding="utf-8").splitlines()
        return [InputItem(f"line {n}", f"{path} line {n}", text=line)
                for n, line in enumerate(lines, 1) if line.strip()]
    items = []
    for n, row in _manifest_rows(path):
        where = f"{path} line {n}"
        if isinstance(row.get("text"), str) and row.get("path") in (None, ""):
            items.append(InputItem(str(row.get("id") or f"line {n}"), where, text=row["text"]))
        elif isinstance(row.get("path"), str) and row["path"]:
            file = Path(row["path"])
            file = file if file.is_absolute() else path.parent / file
            items.append(InputItem(str(row.get("id") or row["path"]), where, path=file))
        else:
            raise ValueError(f"{where}: a row needs a 'path' (a file) or a 'text' field, got "
                             f"fields {sorted(row)}")
    return items


def collect_inputs(inputs: Any, kinds: Sequence[str] = ("image", "audio", "text")
                   ) -> list[InputItem]:
    """The inputs of a folder, a manifest (``.csv`` / ``.jsonl`` / ``.txt``) or a list of
    paths / texts (see the module docstring); ``kinds`` are what the model reads, in order
    of preference (a folder holding several kinds gives the first one it holds)."""
    if isinstance(inputs, (str, os.PathLike)):
        path = Path(inputs)
        if path.is_dir():
            items = _folder_items(path, kinds)
        elif path.is_file():
            if path.suffix.lower() not in (".csv", ".jsonl", ".txt"):
                raise ValueError(f"{path}: a manifest is .csv, .jsonl or .txt (one text per "
                                 "line); give a folder for a set of files")
            items = _manifest_items(path)
        else:
            raise FileNotFoundError(f"inputs {path} do not exist")
    elif isinstance(inputs, Sequence):
        items = []
        for i, x in enumerate(inputs):
            if isinstance(x, Path) or (isinstance(x, str) and "text" not in kinds):
                items.append(InputItem(str(x), str(x), path=Path(x)))
            elif isinstance(x, str):
                items.append(InputItem(str(i), f"text {i}", text=x))
            else:
                raise ValueError(f"inputs[{i}] is a {type(x).__name__}: give file paths or "
                                 "strings")
    else:
        raise ValueError(f"inputs must be a folder, a manifest or a list, got "
                         f"{type(inputs).__name__}")
    if not items:
        raise ValueError(f"no inputs found in {inputs}")
    seen: dict[str, str] = {}
    for item in items:
        if item.id in seen:
            raise ValueError(f"input id {item.id!r} appears twice ({seen[item.id]} and "
                             f"{item.where}); ids must be unique")
        seen[item.id] = item.where
    return items


def _item_kind(item: InputItem) -> str:
    return "text" if item.text is not None else (_kind_of_file(item.path) or "?")


@dataclass(frozen=True)
class _Reader:
    """How files are read for a model: image ``channels`` (3 RGB, 1 grey) and the audio
    ``sample_rate`` clips are resampled to."""

    channels: int = 3
    sample_rate: int | None = None

    @classmethod
    def of(cls, encoder: Encoder) -> _Reader:
        rate = getattr(encoder.backbone.config, "sample_rate", None)
        return cls(getattr(encoder.preprocessor, "channels", 3), rate)


def _read_item(item: InputItem, kind: str, reader: _Reader) -> Any:
    """The loaded input: a text, a uint8 image (C, H, W) or a mono clip at the model's rate."""
    if kind == "text":
        if item.text is not None:
            return item.text
        try:
            return item.path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            raise UnreadableInput(f"{item.where}: cannot read as UTF-8 text ({err})") from None
    if item.path is None:
        raise UnreadableInput(f"{item.where}: expected a file path for {kind}, got a text")
    if not item.path.is_file():
        raise UnreadableInput(f"{item.where}: file {item.path} not found")
    if kind == "image":
        from PIL import Image, UnidentifiedImageError
        from torchvision.transforms.v2.functional import pil_to_tensor

        channels = reader.channels
        try:
            with Image.open(item.path) as img:
                img.load()
                return pil_to_tensor(img.convert("RGB" if channels == 3 else "L"))
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
            raise UnreadableInput(f"{item.where}: cannot read {item.path} as an image "
                                  f"({err})") from None
    try:
        wave, rate = load_audio(item.path)
    except (ValueError, OSError, RuntimeError) as err:
        raise UnreadableInput(f"{item.where}: cannot read {item.path} as audio ({err})"
                              ) from None
    mono = wave.mean(dim=0)
    target = reader.sample_rate or rate
    if rate != target:
        import torchaudio

        mono = torchaudio.functional.resample(mono, rate, target)
    return mono


@dataclass
class _Skipped:
    """Inputs left out with ``skip_corrupt``, and why."""

    items: list[tuple[str, str]] = field(default_factory=list)

    def add(self, item: InputItem, reason: str) -> None:
        self.items.append((item.id, reason))

    def report(self, stream: IO[str]) -> None:
        if self.items:
            print(f"skipped {len(self.items)} unreadable input(s):", file=stream)
            for _, reason in self.items:
                print(f"  {reason}", file=stream)


def _read_batch(items: Sequence[InputItem], kind: str, reader: _Reader, skip_corrupt: bool,
                skipped: _Skipped) -> tuple[list[InputItem], list[Any]]:
    kept, values = [], []
    for item in items:
        try:
            values.append(_read_item(item, kind, reader))
        except UnreadableInput as err:
            if not skip_corrupt:
                raise
            skipped.add(item, str(err))
            continue
        kept.append(item)
    return kept, values


def _encode_batch(encoder: Encoder, kind: str, items: list[InputItem], values: list[Any],
                  skip_corrupt: bool, skipped: _Skipped) -> tuple[list[InputItem], torch.Tensor]:
    """Embeddings of loaded values; an input the model cannot take (a clip too short for one
    window, an image the preprocessor refuses) is named, or skipped one by one."""
    modality = kind if encoder.modality == "image+text" else None
    try:
        return items, encoder.encode(values, modality=modality, batch_size=len(values)).cpu()
    except ValueError as err:
        if len(values) == 1:
            if not skip_corrupt:
                raise UnreadableInput(f"{items[0].where}: {err}") from None
            skipped.add(items[0], f"{items[0].where}: {err}")
            return [], torch.empty(0)
    kept, rows = [], []  # find the input(s) at fault
    for item, value in zip(items, values, strict=True):
        got, emb = _encode_batch(encoder, kind, [item], [value], skip_corrupt, skipped)
        if got:
            kept += got
            rows.append(emb)
    return kept, (torch.cat(rows) if rows else torch.empty(0))


# ======================================================================================
# embed
# ======================================================================================

def _kinds_of(encoder: Encoder) -> tuple[str, ...]:
    return ("image", "text") if encoder.modality == "image+text" else (encoder.modality,)


def load_model_encoder(model: Any) -> Encoder:
    """:func:`~multimodal.hub.load_encoder` of ``model``, and for a task checkpoint that
    did not record its image normalisation, the normalisation measured again by its data
    module (an :class:`~multimodal.hub.Encoder` is returned as it is)."""
    if isinstance(model, Encoder):
        return model
    encoder = load_encoder(model)
    path = Path(model) if isinstance(model, (str, os.PathLike)) else None
    if encoder.preprocessor is None and encoder.modality in ("image", "image+text") \
            and path is not None and path_kind(path) == "checkpoint":
        ckpt = read_checkpoint(path)
        config = encoder.backbone.config
        vision = getattr(config, "vision", config)
        encoder.preprocessor = _data_image_preprocessor(
            (ckpt.get("datamodule_hyper_parameters") or {}).get("_class_path"),
            datamodule_arguments(ckpt), path, int(getattr(vision, "in_channels", 3)),
            getattr(vision, "image_size", None))
    return encoder


def _ids_file(out: Path) -> Path:
    return out.with_name(out.stem + ".ids.json")


def read_embeddings(path: str | Path) -> tuple[list[str], torch.Tensor, dict[str, Any]]:
    """``(ids, embeddings (N, D), metadata)`` of a file written by :func:`embed`."""
    path = Path(path)
    if path.suffix == ".npy":
        import numpy as np

        emb = torch.from_numpy(np.load(path))
        meta = json.loads(_ids_file(path).read_text(encoding="utf-8"))
        return list(meta.pop("ids")), emb, meta
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        header = dict(f.metadata() or {})
        emb = f.get_tensor("embeddings")
    meta = {k: json.loads(v) for k, v in header.items()}
    return list(meta.pop("ids")), emb, meta


def _write(path: Path, ids: list[str], emb: torch.Tensor, meta: dict[str, Any]) -> None:
    """Write atomically: a half-written file never has the final name."""
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".npy":
        import numpy as np

        with open(tmp, "wb") as f:
            np.save(f, emb.numpy())
        ids_tmp = _ids_file(path).with_suffix(".tmp")
        ids_tmp.write_text(json.dumps({"ids": ids, **meta}), encoding="utf-8")
        os.replace(ids_tmp, _ids_file(path))
    else:
        save_safetensors({"embeddings": emb.contiguous()}, tmp,
                         metadata={"ids": json.dumps(ids),
                                   **{k: json.dumps(v) for k, v in meta.items()}})
    os.replace(tmp, path)


def _done_so_far(out: Path, parts: Path, model_name: str) -> dict[str, torch.Tensor]:
    """Embeddings already written by an earlier run into ``out`` or its parts folder."""
    done: dict[str, torch.Tensor] = {}
    files = [out] if out.is_file() else []
    if parts.is_dir():
        files += sorted(parts.glob("part-*" + out.suffix))
    for file in files:
        try:
            ids, emb, meta = read_embeddings(file)
        except Exception as err:  # a damaged part is recomputed, never trusted
            if file == out:
                raise ValueError(f"{out} exists but is not a readable embeddings file "
                                 f"({err}); remove it or choose another --out") from None
            continue
        if meta.get("model") != model_name:
            raise ValueError(f"{file} was written with model {meta.get('model')!r}, not "
                             f"{model_name!r}: remove it or choose another --out")
        done.update(zip(ids, emb, strict=True))
    return done


def embed(model: Any, inputs: Any, out: str | Path | None = None, *, batch_size: int = 32,
          skip_corrupt: bool = False, stream: IO[str] | None = None,
          model_name: str | None = None, on_batch: Callable[[int], None] | None = None
          ) -> tuple[list[str], torch.Tensor]:
    """Embed every input (see the module docstring): ``(ids, embeddings (N, D))`` in input
    order, skipped inputs left out. ``model`` is an :class:`~multimodal.hub.Encoder` or
    anything :func:`~multimodal.hub.load_encoder` reads. With ``out`` (``.safetensors`` or
    ``.npy``) the result is also written, batch by batch, and an interrupted run resumes;
    ``model_name`` (default: the model's path, else its class) is recorded with them and
    must match on resume. ``on_batch(n)`` is called after each batch."""
    encoder = load_model_encoder(model)
    if model_name is None:
        model_name = str(model) if isinstance(model, (str, os.PathLike)) \
            else type(encoder.backbone).__name__
    if Path(model_name).exists():
        model_name = str(Path(model_name).resolve())
    items = collect_inputs(inputs, _kinds_of(encoder))
    kind = _item_kind(items[0])
    if kind not in _kinds_of(encoder):
        raise ValueError(f"{items[0].where} is {'a text' if kind == 'text' else kind} but the "
                         f"model ({type(encoder.backbone).__name__}) reads "
                         f"{' and '.join(_kinds_of(encoder))}")
    stream = stream if stream is not None else sys.stderr
    done: dict[str, torch.Tensor] = {}
    out_path = parts = None
    if out is not None:
        out_path = Path(out)
        if out_path.suffix not in OUTPUT_SUFFIXES:
            raise ValueError(f"--out {out_path}: write .safetensors or .npy")
        out_path.parent.mkdir(parents=True, exist_ok=True)
        parts = out_path.with_name(out_path.name + PARTS_SUFFIX)
        done = _done_so_far(out_path, parts, model_name)
        if done:
            print(f"resuming: {sum(i.id in done for i in items)} of {len(items)} inputs "
                  f"already embedded in {out_path}", file=stream)
    todo = [item for item in items if item.id not in done]
    skipped, reader = _Skipped(), _Reader.of(encoder)
    if todo and parts is not None:
        parts.mkdir(exist_ok=True)
    next_part = len(list(parts.glob("part-*"))) if parts is not None and parts.is_dir() else 0
    with progress(total=len(todo), desc="embed", unit="inputs", stream=stream) as bar:
        for start in range(0, len(todo), batch_size):
            chunk = todo[start:start + batch_size]
            kept, values = _read_batch(chunk, kind, reader, skip_corrupt, skipped)
            if values:
                kept, emb = _encode_batch(encoder, kind, kept, values, skip_corrupt, skipped)
                emb = emb.float()
                done.update(zip([i.id for i in kept], emb, strict=True))
                if parts is not None and kept:
                    _write(parts / f"part-{next_part:06d}{out_path.suffix}",
                           [i.id for i in kept], emb, {"model": model_name})
                    next_part += 1
            bar.update(len(chunk))
            if on_batch is not None:
                on_batch(start // batch_size)
    skipped.report(stream)
    ids = [item.id for item in items if item.id in done]
    if not ids:
        raise ValueError("no input could be embedded")
    emb = torch.stack([done[i] for i in ids])
    if out_path is not None:
        _write(out_path, ids, emb, {"model": model_name,
                                    "skipped": [i for i, _ in skipped.items]})
        if parts is not None and parts.is_dir():
            for file in parts.iterdir():
                file.unlink()
            parts.rmdir()
    return ids, emb


# ======================================================================================
# zero-shot
# ======================================================================================

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
    encoder = load_model_encoder(model)
    if encoder.modality != "image+text":
        raise ValueError(f"zero-shot needs a CLIP / SigLIP (image+text) model; "
                         f"{model if isinstance(model, (str, Path)) else 'the model'} is a "
                         f"{type(encoder.backbone).__name__} (modality {encoder.modality})")
    head = ZeroShotClasses.of(encoder, labels, templates, activation)
    stream = stream if stream is not None else sys.stderr
    items = collect_inputs(inputs, ("image",))
    skipped, reader = _Skipped(), _Reader.of(encoder)
    rows: list[ZeroShotRow] = []
    with progress(total=len(items), desc="zero-shot", unit="images", stream=stream) as bar:
        for start in range(0, len(items), batch_size):
            chunk = items[start:start + batch_size]
            kept, values = _read_batch(chunk, "image", reader, skip_corrupt, skipped)
            if values:
                kept, emb = _encode_batch(encoder, "image", kept, values, skip_corrupt,
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


# ======================================================================================
# caption
# ======================================================================================

@dataclass
class CaptionerBundle:
    """A captioner with what turns files into its inputs and ids into strings."""

    model: Captioner
    tokenizer: Any
    preprocessor: ImagePreprocessor


def _data_image_preprocessor(data_class: str | None, data_arguments: dict[str, Any],
                             path: Path, channels: int,
                             image_size: int | None = None) -> ImagePreprocessor:
    """Image size and normalisation of the run that wrote the checkpoint ``path``, measured
    again by its data module (``data_class(**data_arguments)``; data modules measure their
    mean and std on the training images when the configuration gives none); ``image_size``
    when the data keep the native size."""
    import importlib

    class_path = data_class or "multimodal.data.captions.CaptionDataModule"
    module, name = class_path.rsplit(".", 1)
    try:
        dm = getattr(importlib.import_module(module), name)(**data_arguments)
        dm.setup("fit")
        mean, std = dm.mean, dm.std
    except Exception as err:  # any failure becomes one clear message
        raise ValueError(f"{path}: the image normalisation is not in the checkpoint and "
                         f"its data module ({class_path}) could not measure it again ({err}); "
                         "give --image_size, --mean and --std") from None
    size = getattr(dm, "image_size", None) or image_size
    if not isinstance(size, int):
        raise ValueError(f"{path}: the image size is recorded neither by the data "
                         "module nor by the model; give --image_size")
    mean, std = [float(v) for v in mean], [float(v) for v in std]
    return ImagePreprocessor(size=size, image_mean=mean * channels if len(mean) == 1 else mean,
                             image_std=std * channels if len(std) == 1 else std,
                             channels=channels)


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
        preprocessor = _data_image_preprocessor(loaded.data_class, loaded.data_arguments, path,
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
    skipped = _Skipped()
    reader = _Reader(channels=bundle.preprocessor.channels)
    captioner = bundle.model
    device = next(captioner.parameters()).device
    out: list[tuple[str, str]] = []
    with progress(total=len(items), desc="caption", unit="images", stream=stream) as bar:
        for start in range(0, len(items), batch_size):
            chunk = items[start:start + batch_size]
            kept, values = _read_batch(chunk, "image", reader, skip_corrupt, skipped)
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
