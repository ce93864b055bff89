"""Build and run the LitServe server for one model (``multimodal serve``).

:func:`build_server` loads the model once in the main process to learn what the API
processes check (tokenizer, context, width), makes the endpoint's spec and LitAPI, and a
:class:`litserve.LitServer` with our middleware (:mod:`multimodal.serve.guard`), the
OpenAI error shape for every error, and ``GET /v1/models``. The inference workers load the
model again in their own processes (LitServe spawns them).

:func:`run` binds ``127.0.0.1`` unless told otherwise and drains on SIGTERM: new requests
get 503, those in flight are answered (up to ``drain_timeout_s``), then LitServe shuts its
processes down and the command exits 0. Ctrl-C (SIGINT) does the same after one line
(a second Ctrl-C stops at once): SIGINT is blocked in every process of the server and
taken by one thread of the main process, so no process dies with a ``KeyboardInterrupt``
traceback. A port already in use is refused (:func:`check_port`) before the model loads.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multimodal.pipelines._loaders import classifier, served
from multimodal.serve.models import kind_of

log = logging.getLogger("multimodal.serve")


@dataclass
class ServeConfig:
    """Everything ``multimodal serve`` takes (see :mod:`multimodal.cli.serve`)."""

    model: str
    kind: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch_size: int = 32
    batch_timeout_ms: float = 10.0
    workers: int = 1
    api_servers: int | None = None
    max_request_mb: float = 10.0
    max_queue: int = 256
    max_inputs: int = 2048
    api_key: str | None = None
    timeout_s: float = 60.0
    drain_timeout_s: float = 30.0
    served_model_name: str | None = None
    compile: bool = False
    quantize: str | None = None
    accelerator: str = "auto"
    log_level: str = "warning"

    @property
    def name(self) -> str:
        return self.served_model_name or Path(self.model).name


@dataclass
class Built:
    server: Any
    inflight: Any
    draining: Any
    kind: str


def _apis(config: ServeConfig, kind: str) -> Any:
    """The LitAPI of ``kind``: the one place that maps a kind of model to its endpoint."""
    timeout = config.batch_timeout_ms / 1000
    if kind == "embed":
        from multimodal.serve.embeddings import EmbeddingAPI, EmbeddingSpec, TextRules

        encoder, _ = served(config.model, "embed")
        rules = TextRules.of(encoder, config.max_inputs)
        loss = getattr(encoder.backbone.config, "loss", None)
        del encoder
        batching = dict(max_batch_size=config.max_batch_size, batch_timeout=timeout,
                        compile=config.compile, quantize=config.quantize)
        if rules.modality == "image+text" and rules.images:  # CLIP / SigLIP: /v1/zero-shot
            from multimodal.serve.zero_shot import ClipAPI, ClipSpec

            activation = "sigmoid" if loss == "sigmoid" else "softmax"
            return ClipAPI(config.model, ClipSpec(rules, config.name, activation), **batching)
        return EmbeddingAPI(config.model, EmbeddingSpec(rules, config.name), **batching)
    if kind in ("classify", "transcribe") and (config.quantize or config.compile):
        switch = f"--quantize {config.quantize}" if config.quantize else "--compile"
        raise ValueError(f"{switch} applies to embedding and chat models; {config.model} is a "
                         f"{kind} model (serve it without {switch})")
    if kind == "classify":
        from multimodal.serve.classify import ClassifyAPI, ClassifySpec
        from multimodal.serve.embeddings import TextRules
        encoder, _, names = classifier(config.model)
        rules = TextRules.of(encoder, config.max_inputs)
        del encoder
        return ClassifyAPI(config.model, ClassifySpec(rules, names, config.name),
                           max_batch_size=config.max_batch_size, batch_timeout=timeout)
    if kind == "chat":
        from multimodal.serve.chat import ChatAPI

        return ChatAPI(config.model, quantize=config.quantize, compile=config.compile,
                       model_name=config.name)
    if kind == "transcribe":
        from multimodal.serve.transcription import TranscriptionAPI, TranscriptionSpec

        return TranscriptionAPI(config.model, TranscriptionSpec(config.name),
                                max_batch_size=min(config.max_batch_size, 8),
                                batch_timeout=timeout)
    raise ValueError(f"no endpoint for a {kind!r} model")


def _models_route(config: ServeConfig, kind: str, endpoints: list[str]) -> Any:
    """``GET /v1/models``: the one model, its kind and the endpoints that serve it."""
    created = int(time.time())

    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": config.name, "object": "model",
                                            "created": created, "owned_by": "multimodal",
                                            "kind": kind, "endpoints": endpoints}]}

    return models


def _endpoints(api: Any) -> list[str]:
    """The POST paths ``api`` answers: its spec's path (CLIP / SigLIP: and zero-shot)."""
    from multimodal.serve.zero_shot import ZERO_SHOT_PATH, ClipAPI

    paths = [getattr(getattr(api, "spec", None), "api_path", None)]
    if isinstance(api, ClipAPI):
        paths.append(ZERO_SHOT_PATH)
    return [p for p in paths if p]


def build_server(config: ServeConfig) -> Built:
    """The LitServer for ``config`` (module docstring); not started."""
    import litserve as ls
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    from multimodal.serve.errors import http_exception_handler, validation_exception_handler
    from multimodal.serve.guard import Guard
    from multimodal.serve.zero_shot import ZERO_SHOT_PATH, ClipAPI, not_served_route

    kind = config.kind or kind_of(config.model)
    api = _apis(config, kind)
    inflight, draining = mp.Value("i", 0), mp.Value("i", 0)
    guard = (Guard, {"inflight": inflight, "draining": draining, "api_key": config.api_key,
                     "max_bytes": int(config.max_request_mb * 2 ** 20),
                     "max_queue": config.max_queue})
    server = ls.LitServer(api, accelerator=config.accelerator,
                          workers_per_device=config.workers, timeout=config.timeout_s,
                          middlewares=[guard], model_metadata={"name": config.name,
                                                               "kind": kind})
    server.app.add_exception_handler(HTTPException, http_exception_handler)
    server.app.add_exception_handler(RequestValidationError, validation_exception_handler)
    server.app.add_api_route("/v1/models", _models_route(config, kind, _endpoints(api)),
                             methods=["GET"])
    if not isinstance(api, ClipAPI):  # a 404 that says why
        rules = getattr(getattr(api, "spec", None), "rules", None)
        clip = getattr(rules, "modality", None) == "image+text"
        server.app.add_api_route(ZERO_SHOT_PATH, not_served_route(config.name, kind, clip),
                                 methods=["POST"])
    return Built(server, inflight, draining, kind)


def _drain_then_stop(built: Built, timeout_s: float) -> None:
    built.draining.value = 1
    deadline = time.monotonic() + timeout_s
    while built.inflight.value > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if built.inflight.value > 0:
        log.warning("drain timeout: %d requests still in flight", built.inflight.value)
    while built.server._shutdown_event is None and time.monotonic() < deadline + 5:
        time.sleep(0.05)
    if built.server._shutdown_event is not None:
        built.server._shutdown_event.set()


def check_port(host: str, port: int) -> None:
    """A ``ValueError`` naming ``host:port`` when something already listens there (bound as
    uvicorn binds, ``SO_REUSEADDR``, so a port left in TIME_WAIT by a stopped server is
    free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            raise ValueError(f"port {port} on {host} is in use ({err.strerror}): stop what "
                             "serves there or choose another --port") from None


def _take_ctrl_c(timeout_s: float) -> list[Built]:
    """SIGINT blocked in this thread, so in every thread and process started after it (call
    it first); one thread waits for it: the first Ctrl-C drains and stops the server (as
    SIGTERM; before the server is built, it just ends the command), a second exits at once.
    Returns the list to put the :class:`Built` server in once there is one."""
    from multiprocessing import resource_tracker

    # started first: starting it later unblocks SIGINT in the thread that starts it
    resource_tracker.ensure_running()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    server: list[Built] = []

    def wait() -> None:
        signal.sigwait({signal.SIGINT})
        if not server:
            print("stopped (Ctrl-C) before the model was loaded", file=sys.stderr, flush=True)
            os._exit(0)
        print("stopping (Ctrl-C): finishing the requests in flight; Ctrl-C again to quit "
              "at once", file=sys.stderr, flush=True)
        threading.Thread(target=_drain_then_stop, args=(server[0], timeout_s),
                         daemon=True).start()
        signal.sigwait({signal.SIGINT})
        os._exit(130)

    threading.Thread(target=wait, daemon=True, name="ctrl-c").start()
    return server


def run(config: ServeConfig) -> int:
    """Start the server and block until SIGTERM / Ctrl-C; 0 after a clean drain.

    The inference workers inherit ``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets
    it: OpenMP threads that spin after each operation (the default) take the CPU from the
    server's other processes; measured on the 2-core machine under load, one short MiniLM
    request took 0.5-2 s with spinning threads and 20-60 ms without (1 thread: 40-120 ms).
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before the workers are spawned
    check_port(config.host, config.port)
    ctrl_c = _take_ctrl_c(config.drain_timeout_s)  # before any thread or process starts
    built = build_server(config)
    ctrl_c.append(built)
    started: list[threading.Thread] = []

    def on_sigterm(signum: int, frame: Any) -> None:
        if not started:
            thread = threading.Thread(target=_drain_then_stop,
                                      args=(built, config.drain_timeout_s), daemon=True)
            started.append(thread)
            thread.start()

    signal.signal(signal.SIGTERM, on_sigterm)
    print(f"serving {config.model} ({built.kind}) on http://{config.host}:{config.port}",
          flush=True)
    built.server.run(host=config.host, port=config.port, num_api_servers=config.api_servers,
                     log_level=config.log_level, generate_client_file=False)
    return 0
