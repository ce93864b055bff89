"""``multimodal serve``: one model behind OpenAI-compatible endpoints, on LitServe.

See :mod:`multimodal.serve.server` (building and running), :mod:`~multimodal.serve.models`
(what a path holds), the endpoint modules and docs/serve.md.
"""

from multimodal.serve.models import Served, kind_of, load_served
from multimodal.serve.server import ServeConfig, build_server, run

__all__ = ["ServeConfig", "Served", "build_server", "kind_of", "load_served", "run"]
