"""``multimodal serve --model PATH [--port 8000] [--max_batch_size 32] [--batch_timeout_ms 10]
[--workers N]``: an OpenAI-compatible server for one model, on LitServe (docs/serve.md).

Endpoints by kind of model: ``POST /v1/embeddings`` (encoders: a ``save_pretrained`` or
Hugging Face folder, a task ``.ckpt``; a CLIP / SigLIP also gets ``POST /v1/zero-shot``),
``POST /v1/chat/completions`` (a GGUF chat decoder such as SmolLM2),
``POST /v1/audio/transcriptions`` (Whisper), ``POST /v1/classify`` (a text classifier
``.ckpt``); every server also has ``GET /health`` (200 once the model is
loaded) and ``GET /v1/models``. Binds 127.0.0.1 unless ``--host 0.0.0.0`` (then give
``--api_key``). Bad arguments: one ``error: ...`` line, exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from multimodal.cli.errors import UsageError
from multimodal.cli.flags import model_path
from multimodal.serve.models import KINDS
from multimodal.serve.server import ServeConfig, run

HOSTS = ("127.0.0.1", "0.0.0.0", "::")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="multimodal serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True,
                   help="model folder, .ckpt or .gguf file, or an installed model's name "
                        "(multimodal models lists them)")
    p.add_argument("--kind", choices=KINDS, default=None,
                   help="what to serve (default: from the path: Whisper -> transcribe, "
                        ".gguf -> chat, classifier .ckpt -> classify, else embed, with "
                        "/v1/zero-shot for a CLIP / SigLIP)")
    p.add_argument("--host", default="127.0.0.1", choices=HOSTS,
                   help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max_batch_size", type=int, default=32,
                   help="most requests run as one batch")
    p.add_argument("--batch_timeout_ms", type=float, default=10.0,
                   help="how long a batch waits to fill")
    p.add_argument("--workers", type=int, default=1, help="inference processes per device")
    p.add_argument("--api_servers", type=int, default=None,
                   help="HTTP server processes (default: one per worker)")
    p.add_argument("--max_request_mb", type=float, default=10.0,
                   help="larger request bodies get 413")
    p.add_argument("--max_queue", type=int, default=256,
                   help="requests in flight beyond this get 503 + Retry-After")
    p.add_argument("--max_inputs", type=int, default=2048,
                   help="most texts in one embeddings request")
    p.add_argument("--api_key", default=os.environ.get("MULTIMODAL_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $MULTIMODAL_API_KEY)")
    p.add_argument("--timeout_s", type=float, default=60.0,
                   help="a request waiting longer in the queue gets 504")
    p.add_argument("--drain_timeout_s", type=float, default=30.0,
                   help="on SIGTERM, how long requests in flight may take to finish")
    p.add_argument("--served_model_name", default=None,
                   help="the name /v1/models reports (default: the installed model's name, "
                        "else the path's last part)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the encoder (embeddings) or the one-token decoding "
                        "step (chat)")
    p.add_argument("--quantize", choices=["int8", "int4", "dynamic-int8"], default=None,
                   help="Linears quantised (CPU): int8 / int4 weight-only packed (embeddings "
                        "and chat; a GGUF file's blocks kept packed), or dynamic-int8 "
                        "(weights and activations; embeddings)")
    p.add_argument("--accelerator", choices=["auto", "cpu", "cuda", "mps"], default="auto")
    p.add_argument("--log_level", default="warning",
                   choices=["critical", "error", "warning", "info", "debug"])
    return p


def parse(argv: list[str]) -> ServeConfig:
    """The :class:`ServeConfig` of ``argv``; ``error: ...`` and exit 2 when it is wrong."""
    parser = _parser()
    ns = parser.parse_args(argv)
    try:  # the resolver of every verb: a path, or an installed model's name
        path = model_path(ns.model)
    except UsageError as err:
        parser.error(str(err))
    if ns.served_model_name is None and not Path(ns.model).expanduser().exists():
        ns.served_model_name = ns.model  # a name: reported as given, not its folder's name
    ns.model = path
    if not 1024 <= ns.port <= 65535:
        parser.error(f"--port must be in 1024..65535, got {ns.port}")
    for name in ("max_batch_size", "workers", "max_queue", "max_inputs"):
        if getattr(ns, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(ns, name)}")
    if ns.api_servers is not None and ns.api_servers < 1:
        parser.error(f"--api_servers must be >= 1, got {ns.api_servers}")
    for name in ("batch_timeout_ms", "max_request_mb", "timeout_s", "drain_timeout_s"):
        value = getattr(ns, name)
        if not value >= 0 or (name != "batch_timeout_ms" and value == 0):
            parser.error(f"--{name} must be > 0, got {value}")
    if ns.batch_timeout_ms / 1000 >= ns.timeout_s:
        parser.error("--batch_timeout_ms must be shorter than --timeout_s")
    if ns.host != "127.0.0.1" and not ns.api_key:
        print(f"warning: binding {ns.host} without --api_key: anyone who can reach this "
              "machine can use the server", file=sys.stderr)
    return ServeConfig(**vars(ns))


def main(argv: list[str]) -> int:
    """``multimodal serve``: run until SIGTERM / Ctrl-C; 0 after a clean shutdown, 2 on bad
    arguments or a model that cannot be served."""
    config = parse(argv)
    try:
        return run(config)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
