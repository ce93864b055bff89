"""The verbs over folders moved to :mod:`multimodal.pipelines` (``inputs``, ``embed``,
``zero_shot``, ``caption``); their names are kept importable from here for one release."""

from multimodal.pipelines.caption import CaptionerBundle, caption, load_captioner  # noqa: F401
from multimodal.pipelines.embed import embed, load_model_encoder, read_embeddings  # noqa: F401
from multimodal.pipelines.inputs import (  # noqa: F401
    InputItem,
    UnreadableInput,
    collect_inputs,
)
from multimodal.pipelines.zero_shot import (  # noqa: F401
    DEFAULT_TEMPLATES,
    ZeroShotClasses,
    ZeroShotRow,
    class_embeddings,
    zero_shot,
)
