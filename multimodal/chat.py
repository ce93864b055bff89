"""``mm.chat`` moved to :mod:`multimodal.pipelines.chat`; kept importable from here for one
release."""

from multimodal.pipelines.chat import chat  # noqa: F401
