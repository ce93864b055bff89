"""Deprecated: the verbs over folders moved to :mod:`multimodal.pipelines`. Importing this
module warns; it is removed in 0.2.

``mm.embed``, ``mm.zero_shot``, ``mm.caption`` are unchanged; the other names are defined in
:mod:`multimodal.pipelines.inputs`, ``embed``, ``zero_shot`` and ``caption``.
"""

from __future__ import annotations

from multimodal.moved import deprecated, moved_names

# name -> the module that defines it now (resolved on first use)
MOVED: dict[str, str] = {
    **dict.fromkeys([
        "CaptionerBundle", "caption", "load_captioner"
    ], "multimodal.pipelines.caption"),
    **dict.fromkeys([
        "embed", "load_model_encoder", "read_embeddings"
    ], "multimodal.pipelines.embed"),
    **dict.fromkeys([
        "InputItem", "UnreadableInput", "collect_inputs"
    ], "multimodal.pipelines.inputs"),
    **dict.fromkeys([
        "DEFAULT_TEMPLATES", "ZeroShotClasses", "ZeroShotRow", "class_embeddings", "zero_shot"
    ], "multimodal.pipelines.zero_shot"),
}

deprecated("multimodal.inference",
           "multimodal.embed / multimodal.zero_shot / multimodal.caption, or import from "
           "multimodal.pipelines.inputs / embed / zero_shot / caption")

__getattr__ = moved_names(__name__, MOVED)
