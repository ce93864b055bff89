"""Soak (slow): 2 000 mixed good and bad requests from 32 concurrent clients at a MiniLM
server. Every good request is answered with the embeddings ``Encoder.encode`` gives
offline, every bad one with its 4xx, the server survives, and its memory stays flat (RSS
of the whole process tree at the end within 10 % of after warm-up)."""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.serve.running import Server
from tests.serve.test_real_models import SENTENCES, minilm

pytestmark = pytest.mark.slow

KEY = "soak-key"
AUTH = {"Authorization": f"Bearer {KEY}"}

# bad requests: (body, headers, expected status)
BAD = [
    ('{"input": ["a cat"', AUTH, 400),                     # malformed JSON
    ({"model": "m"}, AUTH, 400),                            # missing field
    ({"input": [1, 2]}, AUTH, 400),                         # wrong type
    ({"input": "word " * 400}, AUTH, 400),                  # over the 256-token context
    ({"input": "x" * (1_100_000)}, AUTH, 413),              # over --max_request_mb 1
    ({"input": "a cat"}, {"Authorization": "Bearer no"}, 401),
]


def tree_rss(pid: int) -> int:
    import psutil

    root = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])


def test_2000_mixed_requests_from_32_clients_all_answered_memory_flat():
    pytest.importorskip("psutil")
    import multimodal as mm

    folder = minilm()
    want = mm.load_encoder(folder).encode(SENTENCES).numpy()
    g = random.Random(0)
    jobs = []
    for i in range(2000):
        if i % 3 == 2:
            jobs.append(("bad", *BAD[(i // 3) % len(BAD)]))
        else:
            picks = [g.randrange(len(SENTENCES)) for _ in range(g.randint(1, 3))]
            jobs.append(("good", {"input": [SENTENCES[k] for k in picks]}, AUTH, picks))
    srv = Server(folder, "--api_key", KEY, "--max_request_mb", "1", "--max_queue", "1024",
                 "--max_batch_size", "32")

    def send(job):
        kind, body, headers, expect = job
        reply = srv.post("/v1/embeddings", body, headers=headers, timeout=300)
        if kind == "bad":
            assert reply.status == expect, (body if isinstance(body, str) else
                                            json.dumps(body)[:80], reply.body[:200])
            assert "error" in reply.json()
            return
        assert reply.status == 200, reply.body[:200]
        got = np.array([d["embedding"] for d in reply.json()["data"]], dtype=np.float32)
        np.testing.assert_allclose(got, want[expect], atol=1e-5)

    try:
        warm = [("good", {"input": SENTENCES[:1 + i % 3]}, AUTH, list(range(1 + i % 3)))
                for i in range(200)]
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(send, warm))
        before = tree_rss(srv.proc.pid)
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(send, jobs))
        after = tree_rss(srv.proc.pid)
        assert srv.get("/health").status == 200
    finally:
        assert srv.stop() == 0
    assert after <= 1.10 * before, f"RSS grew from {before / 2**20:.0f} MiB to " \
                                   f"{after / 2**20:.0f} MiB"
    print(f"RSS after warm-up {before / 2**20:.0f} MiB, after 2000 requests "
          f"{after / 2**20:.0f} MiB")
