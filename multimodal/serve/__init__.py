"""``multimodal serve``: one model behind OpenAI-compatible endpoints, on LitServe.

See :mod:`multimodal.serve.server` (building and running), :mod:`~multimodal.serve.models`
(what a path holds), the endpoint modules and docs/serve.md.
"""

from typing import Any

from multimodal.serve.models import Served, kind_of
from multimodal.serve.server import ServeConfig, build_server, run

__all__ = ["ServeConfig", "Served", "build_server", "kind_of", "run"]


def __getattr__(name: str) -> Any:
    if name == "load_served":  # deprecated, removed in 0.2: warns in multimodal.serve.models
        from multimodal.serve import models

        return getattr(models, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
