"""Deprecated: models by folder and by name moved out of ``multimodal.hub``. Importing this
module warns; it is removed in 0.2.

``from_pretrained`` / ``read_config`` / ``folder_preprocessor`` are in :mod:`multimodal.loading`,
``create_model`` / ``list_presets`` in :mod:`multimodal.models`, the checkpoint readers in
:mod:`multimodal.checkpoints`, ``Encoder`` / ``load_encoder`` in :mod:`multimodal.encoder`.
``multimodal.from_pretrained``, ``multimodal.create_model`` ... are unchanged.
"""

from __future__ import annotations

from multimodal.moved import deprecated, moved_names

# name -> the module that defines it now (resolved on first use)
MOVED: dict[str, str] = {
    **dict.fromkeys([
        "from_pretrained", "read_config", "folder_preprocessor"
    ], "multimodal.loading"),
    **dict.fromkeys(["create_model", "list_presets"], "multimodal.models"),
    **dict.fromkeys([
        "load_checkpoint", "CHECKPOINT_HINT", "checkpoint_image_preprocessor",
        "checkpoint_tokenizer", "datamodule_arguments", "model_from_checkpoint",
        "read_checkpoint"
    ], "multimodal.checkpoints"),
    **dict.fromkeys(["Encoder", "TokenFeatures", "load_encoder"], "multimodal.encoder"),
}

deprecated("multimodal.hub",
           "multimodal.from_pretrained / multimodal.create_model / multimodal.list_presets "
           "(defined in multimodal.loading and multimodal.models), the checkpoint readers of "
           "multimodal.checkpoints, multimodal.load_encoder")

__getattr__ = moved_names(__name__, MOVED)
