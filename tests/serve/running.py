"""Start ``multimodal serve`` as a subprocess on a free localhost port and talk to it with the
standard library (tests only ever send traffic to 127.0.0.1)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def request(port: int, method: str, path: str, body: bytes | str | dict | list | None = None,
            headers: dict[str, str] | None = None, timeout: float = 60) -> Reply:
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body,
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def post(port: int, path: str, body: Any, **kw: Any) -> Reply:
    return request(port, "POST", path, body, **kw)


class Server:
    """``multimodal serve --model MODEL ARGS`` on a free port; :meth:`stop` sends SIGTERM."""

    def __init__(self, model: str | Path, *args: str, startup_s: float = 120,
                 own_group: bool = False) -> None:
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        # a file, not a pipe: a full pipe would block the server
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed with the Server)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "multimodal.cli.serve", "--model", str(model),
             "--port", str(self.port), *args],
            env=env, cwd=str(ROOT), stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=own_group)  # own_group: killpg reaches it as Ctrl-C would
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n"
                                   + self.output())
            try:
                if request(self.port, "GET", "/health", timeout=2).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError("server did not become healthy in time")

    def post(self, path: str, body: Any, **kw: Any) -> Reply:
        return post(self.port, path, body, **kw)

    def get(self, path: str, **kw: Any) -> Reply:
        return request(self.port, "GET", path, **kw)

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit status (killed after ``timeout`` s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")
