"""Chunk size picked per split (``auto_chunk_bytes``): enough chunks for every rank and
worker to read whole chunks of its own, within LitData's usual sizes."""

from __future__ import annotations

import json
import multiprocessing

import numpy as np
import pytest

from multimodal.data.shards import (
    MAX_CHUNK_BYTES,
    MIN_CHUNK_BYTES,
    MIN_CHUNKS,
    auto_chunk_bytes,
    item_bytes,
)


class Items:
    """``n`` items of ``size`` payload bytes (bytes + an int label)."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __call__(self, index: int) -> dict:
        return {"image": bytes(self.size - 8), "label": index % 3}


def test_item_bytes_counts_payloads():
    item = {"a": b"xyz", "b": "hé", "c": np.zeros(5, dtype=np.int32), "d": 7}
    assert item_bytes(item) == 3 + 2 + 20 + 8


def test_chunk_size_cuts_a_mid_sized_split_into_min_chunks():
    # 10 000 items of 600 bytes: 6 000 000 / 64 = 93 750 bytes a chunk
    assert auto_chunk_bytes(Items(10_000, 600)) == 10_000 * 600 // MIN_CHUNKS


@pytest.mark.parametrize("n,size,expected", [
    (10, 100, MIN_CHUNK_BYTES),          # tiny: one small chunk, not 64 of 16 bytes
    (1_000_000, 100_000, MAX_CHUNK_BYTES),  # 100 GB: LitData's usual 64 MB chunks
    (0, 100, MAX_CHUNK_BYTES),
])
def test_chunk_size_stays_within_bounds(n, size, expected):
    assert auto_chunk_bytes(Items(n, size)) == expected


@pytest.mark.slow
def test_written_split_has_several_chunks_and_every_item(tmp_path):
    pytest.importorskip("litdata")
    from multimodal.data.shards import write_shards

    before = multiprocessing.get_start_method(allow_none=True)
    sizes = write_shards("images", {"train": Items(3000, 200)}, str(tmp_path / "out"))
    assert sizes == {"train": 3000}
    # litdata.optimize sets spawn process-wide; write_shards puts the caller's method back
    assert multiprocessing.get_start_method(allow_none=True) == before
    index = json.loads((tmp_path / "out" / "train" / "index.json").read_text())
    chunk_items = [c["chunk_size"] for c in index["chunks"]]
    assert sum(chunk_items) == 3000
    # 600 000 bytes in chunks of at most 64 KB: ten chunks or so, never one
    assert len(chunk_items) >= 600_000 // (MIN_CHUNK_BYTES * 11 // 10)
