"""A sentence-transformers folder's pooling: ``modules.json`` + ``1_Pooling/config.json``.

A sentence-transformers model is a pipeline of modules listed in ``modules.json``: the
transformer (the Hugging Face layout folder itself), a ``Pooling`` module (its
``config.json`` says which of ``pooling_mode_cls_token``, ``pooling_mode_mean_tokens``,
``pooling_mode_max_tokens``, ``pooling_mode_mean_sqrt_len_tokens``,
``pooling_mode_lasttoken`` is on) and optionally ``Normalize`` (unit length).
``sentence_bert_config.json`` may cap the tokens per text (``max_seq_length``).

:func:`read_folder_pooling` turns that into a :class:`FolderPooling`; a pipeline this package
cannot reproduce (a ``Dense`` projection, several pooling modes concatenated, weighted
mean) is a ValueError naming the file, never a silently different embedding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multimodal.nn.pool import TOKEN_POOLING

__all__ = ["FolderPooling", "read_folder_pooling", "write_folder_pooling"]

MODULES_NAME = "modules.json"
POOLING_DIR = "1_Pooling"
ST_CONFIG_NAME = "sentence_bert_config.json"

# pooling_mode_* key of sentence-transformers -> our mode name (multimodal.nn.pool)
_MODE_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_lasttoken": "lasttoken",
}
_UNSUPPORTED_KEYS = ("pooling_mode_weightedmean_tokens",)


@dataclass(frozen=True)
class FolderPooling:
    """How a folder turns token features into one embedding: ``mode`` (one of
    :data:`multimodal.nn.pool.TOKEN_POOLING`), ``normalize`` (L2 to unit length after
    pooling) and ``max_length`` (tokens per text, special tokens included; None: the
    model's context)."""

    mode: str
    normalize: bool = False
    max_length: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in TOKEN_POOLING:
            raise ValueError(f"unknown pooling {self.mode!r}; known: {', '.join(TOKEN_POOLING)}")
        if self.max_length is not None and self.max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {self.max_length}")


def _json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{file} is not readable JSON: {err}") from None


def _pooling_mode(file: Path) -> str:
    cfg = _json(file)
    if not isinstance(cfg, dict):
        raise ValueError(f"{file}: expected a JSON object")
    if isinstance(cfg.get("pooling_mode"), str):  # the short form
        mode = {"mean_tokens": "mean", "cls_token": "cls", "max_tokens": "max"}.get(
            cfg["pooling_mode"], cfg["pooling_mode"])
        if mode not in TOKEN_POOLING:
            raise ValueError(f"{file}: unsupported pooling_mode {cfg['pooling_mode']!r}; "
                             f"supported: {', '.join(TOKEN_POOLING)}")
        return mode
    bad = [k for k in _UNSUPPORTED_KEYS if cfg.get(k)]
    if bad:
        raise ValueError(f"{file}: {', '.join(bad)} is not supported; supported: "
                         f"{', '.join(_MODE_KEYS)}")
    on = [mode for key, mode in _MODE_KEYS.items() if cfg.get(key)]
    if len(on) != 1:
        raise ValueError(f"{file}: exactly one pooling mode must be on (several are "
                         f"concatenated by sentence-transformers, which is not supported), "
                         f"got {on or 'none'}")
    return on[0]


def read_folder_pooling(folder: str | Path) -> FolderPooling | None:
    """The pooling a sentence-transformers folder declares, or None when it declares none
    (no ``modules.json`` and no ``1_Pooling/config.json``)."""
    folder = Path(folder)
    modules_file = folder / MODULES_NAME
    normalize = False
    pooling_file = folder / POOLING_DIR / "config.json"
    if modules_file.is_file():
        modules = _json(modules_file)
        if not isinstance(modules, list):
            raise ValueError(f"{modules_file}: expected a list of modules")
        pooling_path = None
        for i, module in enumerate(modules):
            kind = str(module.get("type", "")) if isinstance(module, dict) else ""
            name = kind.rsplit(".", 1)[-1]
            if name == "Pooling":
                pooling_path = folder / str(module.get("path", POOLING_DIR)) / "config.json"
            elif name == "Normalize":
                normalize = True
            elif name not in ("Transformer", "CLIPModel"):
                raise ValueError(f"{modules_file}: module {i} of type {kind or '?'} is not "
                                 "supported (supported: Transformer, Pooling, Normalize)")
        if pooling_path is None:
            return None
        pooling_file = pooling_path
    if not pooling_file.is_file():
        if modules_file.is_file():
            raise ValueError(f"{modules_file} names a Pooling module but {pooling_file} "
                             "does not exist")
        return None
    max_length = None
    st_file = folder / ST_CONFIG_NAME
    if st_file.is_file():
        value = _json(st_file)
        value = value.get("max_seq_length") if isinstance(value, dict) else None
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{st_file}: max_seq_length must be a positive integer, "
                             f"got {value!r}")
        max_length = value
    return FolderPooling(_pooling_mode(pooling_file), normalize, max_length)


def write_folder_pooling(folder: str | Path, pooling: FolderPooling, dim: int) -> None:
    """Write ``pooling`` in the sentence-transformers layout (``modules.json``,
    ``1_Pooling/config.json``, ``sentence_bert_config.json`` when ``max_length`` is set) so
    :func:`read_folder_pooling` reads it back."""
    folder = Path(folder)
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": POOLING_DIR,
                "type": "sentence_transformers.models.Pooling"}]
    if pooling.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    (folder / POOLING_DIR).mkdir(parents=True, exist_ok=True)
    (folder / MODULES_NAME).write_text(json.dumps(modules, indent=2))
    cfg = {"word_embedding_dimension": int(dim),
           **{key: mode == pooling.mode for key, mode in _MODE_KEYS.items()}}
    (folder / POOLING_DIR / "config.json").write_text(json.dumps(cfg, indent=2))
    if pooling.max_length is not None:
        (folder / ST_CONFIG_NAME).write_text(json.dumps({"max_seq_length": pooling.max_length}))
