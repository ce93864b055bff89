"""``multimodal serve`` at its edges: a port already in use is one ``error:`` line and exit 2
before the model loads; Ctrl-C (SIGINT to the server, or to its whole process group as a
terminal sends it) stops it with one line and exit 0, no traceback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.serve.running import ROOT, Server


def test_a_busy_port_is_one_error_line_and_exit_2(tiny_encoder):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "multimodal.cli.serve", "--model", str(tiny_encoder),
             "--port", str(port)], capture_output=True, text=True, timeout=120, cwd=str(ROOT),
            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2, out.stderr
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert lines == [f"error: port {port} on 127.0.0.1 is in use (Address already in use): "
                     "stop what serves there or choose another --port"]


@pytest.mark.parametrize("whole_group", [False, True])
def test_ctrl_c_stops_the_server_with_one_line_and_exit_0(tiny_encoder, whole_group):
    srv = Server(tiny_encoder, own_group=whole_group)
    try:
        assert srv.post("/v1/embeddings", {"input": "a cat"}).status == 200
        if whole_group:
            os.killpg(srv.proc.pid, signal.SIGINT)
        else:
            srv.proc.send_signal(signal.SIGINT)
        assert srv.proc.wait(timeout=60) == 0, srv.output()
        if whole_group:  # every process of the server ends (the resource tracker last)
            deadline = time.monotonic() + 20
            with pytest.raises(ProcessLookupError):
                while time.monotonic() < deadline:
                    os.killpg(srv.proc.pid, 0)
                    time.sleep(0.2)
    finally:
        srv.kill()
    text = srv.output()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    lines = text.strip().splitlines()
    assert lines[0].startswith("serving ") and lines[1].startswith("stopping (Ctrl-C)")
    assert len(lines) == 2, text
