"""``TokenNLL`` under data parallelism: 2 CPU processes (gloo), each with its own
held-out batches, both compute the NLL of *all* tokens, not their own share."""

from __future__ import annotations

import math
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from multimodal.tasks.language_model import TokenNLL

# (summed NLL, tokens) per batch, per rank: rank 0 alone would say 3.0 nats per token
BATCHES = {0: [(3.0, 1)], 1: [(3.0, 3), (4.0, 4)]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        acc = TokenNLL()
        for nll, count in BATCHES[rank]:
            acc.update(torch.tensor(nll), torch.tensor(count))
        torch.save({"mean": acc.compute(), "ppl": acc.perplexity},
                   Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes import torch and the package: over a minute here
def test_token_nll_is_the_global_mean_on_every_rank(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    total = sum(n for batches in BATCHES.values() for n, _ in batches)  # 10 nats
    count = sum(c for batches in BATCHES.values() for _, c in batches)  # 8 tokens
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert float(got["mean"]) == total / count == 1.25
        assert math.isclose(got["ppl"], math.exp(1.25), rel_tol=1e-12)


def test_token_nll_in_one_process() -> None:
    acc = TokenNLL()
    acc.update(torch.tensor(3.0), torch.tensor(1))
    assert acc.mean == 3.0
    acc.reset()
    assert int(acc.count) == 0 and float(acc.total) == 0.0
