"""``mm.embed`` / ``multimodal embed``: one embedding per input of a folder or manifest
(:mod:`multimodal.pipelines.inputs`).

``embed`` writes ``(N, D)`` float32 embeddings with their ids to ``.safetensors`` (tensor
``embeddings``, the ids in the metadata) or ``.npy`` (the ids in ``<name>.ids.json``
beside it). Work is saved batch by batch in ``<out>.parts/``; a run that is interrupted and
started again with the same ``out`` reads what is there and embeds only the rest (an
``out`` written by another model is refused, never mixed).

Resuming goes by content, not by position: every row is stored with a hash of its input
(SHA-256 of the text, or of the file's bytes; metadata ``hashes``, beside ``ids``), and a
row is reused only for an input whose hash it carries. An edited line is embedded again,
an inserted one embedded, lines that moved keep their vectors, a deleted one is dropped;
the run says how many rows it reused and how many it embedded. A file written without
hashes (an older version) is never trusted: everything is embedded again.

Inputs are batched and each embedding is the same whatever it was batched with
(:meth:`multimodal.encoder.Encoder.encode`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from multimodal.encoder import Encoder
from multimodal.moved import old_names
from multimodal.pipelines._loaders import model_encoder
from multimodal.pipelines.inputs import (
    InputItem,
    Reader,
    Skipped,
    UnreadableInput,
    check_kind,
    collect_inputs,
    read_batch,
)
from multimodal.progress import progress
from multimodal.weights import save_safetensors

__all__ = ["embed", "encode_batch", "read_embeddings"]

PARTS_SUFFIX = ".parts"
OUTPUT_SUFFIXES = (".safetensors", ".npy")


def encode_batch(encoder: Encoder, kind: str, items: list[InputItem], values: list[Any],
                  skip_corrupt: bool, skipped: Skipped) -> tuple[list[InputItem], torch.Tensor]:
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
        got, emb = encode_batch(encoder, kind, [item], [value], skip_corrupt, skipped)
        if got:
            kept += got
            rows.append(emb)
    return kept, (torch.cat(rows) if rows else torch.empty(0))


def _kinds_of(encoder: Encoder) -> tuple[str, ...]:
    return ("image", "text") if encoder.modality == "image+text" else (encoder.modality,)


__getattr__ = old_names(__name__, {
    "load_model_encoder": (lambda: model_encoder,
                           "multimodal.embed(multimodal.load(path), inputs) (or "
                           "multimodal.load_encoder(path))")})


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


def content_hash(item: InputItem) -> str:
    """SHA-256 (hex) of what ``item`` holds: its text, or its file's bytes; a file that
    cannot be read hashes to its path (it is reported when embedded)."""
    digest = hashlib.sha256()
    if item.text is not None or item.path is None:
        digest.update(b"text\0" + (item.text or "").encode("utf-8"))
        return digest.hexdigest()
    digest.update(b"file\0")
    try:
        with open(item.path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        digest.update(b"unreadable\0" + str(item.path).encode())
    return digest.hexdigest()


def _done_so_far(out: Path, parts: Path, model_name: str,
                 stream: IO[str] | None = None) -> tuple[dict[str, torch.Tensor], int]:
    """Embeddings already written by an earlier run into ``out`` or its parts folder, by
    content hash, and how many rows ``out`` itself held. Rows without hashes are left out."""
    done: dict[str, torch.Tensor] = {}
    rows = 0
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
        if file == out:
            rows = len(ids)
        hashes = meta.get("hashes")
        if not isinstance(hashes, list) or len(hashes) != len(ids):
            if stream is not None:
                print(f"{file} records no content hashes (an older version wrote it): its "
                      "rows are not reused", file=stream)
            continue
        done.update(zip(hashes, emb, strict=True))
    return done, rows


def embed(model: Any, inputs: Any, out: str | Path | None = None, *, batch_size: int = 32,
          skip_corrupt: bool = False, stream: IO[str] | None = None,
          model_name: str | None = None, on_batch: Callable[[int], None] | None = None
          ) -> tuple[list[str], torch.Tensor]:
    """Embed every input (see the module docstring): ``(ids, embeddings (N, D))`` in input
    order, skipped inputs left out. ``model`` is an :class:`~multimodal.encoder.Encoder`,
    what :func:`multimodal.load` returned, or anything
    :func:`~multimodal.encoder.load_encoder` reads (a task checkpoint that recorded no
    image normalisation gets the one its data module measures). With ``out`` (``.safetensors`` or
    ``.npy``) the result is also written, batch by batch, and an interrupted run resumes;
    ``model_name`` (default: the model's path, else its class) is recorded with them and
    must match on resume. ``on_batch(n)`` is called after each batch."""
    path = getattr(model, "path", model)  # a Loaded: where it was read from
    encoder = model_encoder(model)
    if model_name is None:
        model_name = str(path) if isinstance(path, (str, os.PathLike)) \
            else type(encoder.backbone).__name__
    if Path(model_name).exists():
        model_name = str(Path(model_name).resolve())
    items = collect_inputs(inputs, _kinds_of(encoder))
    kind = check_kind(items, _kinds_of(encoder),
                      f"the model ({type(encoder.backbone).__name__})")
    stream = stream if stream is not None else sys.stderr
    done: dict[str, torch.Tensor] = {}  # content hash -> embedding
    hashes: dict[str, str] = {}  # input id -> content hash
    out_path = parts = None
    if out is not None:
        out_path = Path(out)
        if out_path.suffix not in OUTPUT_SUFFIXES:
            raise ValueError(f"--out {out_path}: write .safetensors or .npy")
        out_path.parent.mkdir(parents=True, exist_ok=True)
        parts = out_path.with_name(out_path.name + PARTS_SUFFIX)
        hashes = {item.id: content_hash(item) for item in items}
        done, before = _done_so_far(out_path, parts, model_name, stream)
        if done or before:
            reused = sum(hashes[i.id] in done for i in items)
            wanted = set(hashes.values())
            dropped = sum(h not in wanted for h in done)
            print(f"resuming: {reused} of {len(items)} inputs reused from {out_path} "
                  f"(same content), {len(items) - reused} to embed (changed or new), "
                  f"{dropped} stored row(s) dropped (no longer in the inputs)", file=stream)
    key = hashes.get if out is not None else (lambda i: i)  # what a row is stored under
    todo = [item for item in items if key(item.id) not in done]
    skipped, reader = Skipped(), Reader.of(encoder)
    if todo and parts is not None:
        parts.mkdir(exist_ok=True)
    next_part = len(list(parts.glob("part-*"))) if parts is not None and parts.is_dir() else 0
    with progress(total=len(todo), desc="embed", unit="inputs", stream=stream) as bar:
        for start in range(0, len(todo), batch_size):
            chunk = todo[start:start + batch_size]
            kept, values = read_batch(chunk, kind, reader, skip_corrupt, skipped)
            if values:
                kept, emb = encode_batch(encoder, kind, kept, values, skip_corrupt, skipped)
                emb = emb.float()
                done.update(zip([key(i.id) for i in kept], emb, strict=True))
                if parts is not None and kept:
                    _write(parts / f"part-{next_part:06d}{out_path.suffix}",
                           [i.id for i in kept], emb,
                           {"model": model_name, "hashes": [hashes[i.id] for i in kept]})
                    next_part += 1
            bar.update(len(chunk))
            if on_batch is not None:
                on_batch(start // batch_size)
    skipped.report(stream)
    ids = [item.id for item in items if key(item.id) in done]
    if not ids:
        raise ValueError("no input could be embedded")
    emb = torch.stack([done[key(i)] for i in ids])
    if out_path is not None:
        _write(out_path, ids, emb, {"model": model_name, "hashes": [hashes[i] for i in ids],
                                    "skipped": [i for i, _ in skipped.items]})
        if parts is not None and parts.is_dir():
            for file in parts.iterdir():
                file.unlink()
            parts.rmdir()
    return ids, emb
