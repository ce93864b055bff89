"""The server under pressure and at the end: a queue bound answered with 503 + Retry-After,
SIGTERM draining the requests in flight (every accepted request answered, exit 0), and the
command line's one-line errors."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from multimodal.cli.serve import main
from tests.serve.conftest import TEXTS
from tests.serve.running import Server


def test_queue_bound_then_sigterm_drains_in_flight_requests_and_exits_0(tiny_encoder):
    import multimodal as mm

    # a batch waits up to 3 s to fill 8 requests: two requests stay in flight that long
    srv = Server(tiny_encoder, "--max_queue", "2", "--max_batch_size", "8",
                 "--batch_timeout_ms", "3000", "--timeout_s", "30")
    try:
        replies: dict[int, object] = {}

        def send(i: int) -> None:
            replies[i] = srv.post("/v1/embeddings", {"input": TEXTS[i]})

        threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.8)
        full = srv.post("/v1/embeddings", {"input": TEXTS[2]})
        assert full.status == 503
        assert full.headers["retry-after"] == "1"
        assert full.json()["error"]["code"] == "queue_full"

        srv.proc.send_signal(15)
        time.sleep(0.3)
        late = srv.post("/v1/embeddings", {"input": TEXTS[3]}, timeout=10)
        assert late.status == 503
        assert late.json()["error"]["code"] == "shutting_down"
        for t in threads:
            t.join(timeout=30)
        assert srv.proc.wait(timeout=60) == 0, srv.output()
    finally:
        srv.kill()
    offline = mm.load_encoder(tiny_encoder)
    for i in range(2):
        assert replies[i].status == 200, replies[i].body
        got = np.array(replies[i].json()["data"][0]["embedding"], dtype=np.float32)
        np.testing.assert_allclose(got, offline.encode([TEXTS[i]])[0].numpy(), atol=1e-5)


@pytest.mark.parametrize(("argv", "says"), [
    (["--model", "/no/such/folder"], "does not exist"),
    (["--model", "."], None),  # checked below with a bad number
    ([], "--model"),
])
def test_bad_arguments_are_one_error_line_and_exit_2(capsys, argv, says):
    if says is None:
        argv = [*argv, "--max_batch_size", "0"]
        says = "--max_batch_size must be >= 1"
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0]


def test_host_outside_the_list_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--model", ".", "--host", "10.0.0.1"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.startswith("error: argument --host")
