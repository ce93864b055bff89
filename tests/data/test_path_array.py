"""PathArray: a manifest's paths in one UTF-8 buffer, relative to its folder."""

from __future__ import annotations

import os

import numpy as np

from multimodal.data.readers import PathArray, read_labelled_manifest


def test_path_array_holds_the_paths_in_one_buffer():
    rel = ["a/x.png", "b/ÿé.png", "/abs/y.png", "c/z.png"]
    paths = PathArray.from_strings(rel, root="/data/")
    assert len(paths) == 4
    assert paths.tolist() == ["/data/a/x.png", "/data/b/ÿé.png", "/abs/y.png", "/data/c/z.png"]
    assert paths.data.nbytes == sum(len(p.encode("utf-8")) for p in rel)
    sub = paths[np.array([3, 1])]
    assert isinstance(sub, PathArray) and sub.data is paths.data
    assert list(sub) == ["/data/c/z.png", "/data/b/ÿé.png"] and sub[np.int64(0)] == "/data/c/z.png"
    assert PathArray.from_strings([]).tolist() == []


def test_manifest_paths_are_relative_to_it_and_labels_indexed(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("p.png", "q.png", "r.png"):
        (tmp_path / "sub" / name).write_bytes(b"x")
    (tmp_path / "m.csv").write_text("path,label\nsub/q.png,dog\n./sub/p.png,cat\nsub/r.png,dog\n")
    files = read_labelled_manifest(tmp_path / "m.csv")
    assert files.class_names == ("cat", "dog")
    assert files.labels.tolist() == [1, 0, 1]
    assert files.paths.tolist() == [os.path.join(tmp_path, "sub", n)
                                    for n in ("q.png", "p.png", "r.png")]
