"""``multimodal serve`` on a tiny text classifier checkpoint: /v1/classify against the
classification task's own forward, with the checkpoint's class names."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

import multimodal as mm
from multimodal.serve.models import kind_of
from tests.serve.conftest import TEXTS
from tests.serve.running import Server

NAMES = ["animals", "colours", "shapes"]


@pytest.fixture(scope="module")
def server(tiny_classifier):
    srv = Server(tiny_classifier, "--batch_timeout_ms", "100")
    yield srv
    assert srv.stop() == 0


def task_probabilities(path, texts) -> np.ndarray:
    """Softmax of ClassificationTask.forward, the training path, one text at a time."""
    from multimodal.checkpoints import checkpoint_tokenizer, read_checkpoint
    from multimodal.tasks.classification import ClassificationTask

    ckpt = read_checkpoint(path)
    model = mm.from_pretrained(path)
    task = ClassificationTask(model=model).eval()
    tok = checkpoint_tokenizer(ckpt)
    rows = []
    with torch.no_grad():
        for text in texts:
            batch = tok.encode_batch([text], add_cls=True, add_sep=True)
            rows.append(torch.softmax(task(dict(batch)), dim=-1)[0].numpy())
    return np.stack(rows)


def test_a_classifier_checkpoint_is_served_as_classify(tiny_classifier):
    assert kind_of(tiny_classifier) == "classify"


def test_classify_equals_the_tasks_forward_with_class_names(server, tiny_classifier):
    bodies = [{"input": TEXTS[i % 5: i % 5 + 2]} for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda b: server.post("/v1/classify", b), bodies))
    for body, reply in zip(bodies, replies, strict=True):
        assert reply.status == 200, reply.body
        want = task_probabilities(tiny_classifier, body["input"])
        for row, expected in zip(reply.json()["data"], want, strict=True):
            got = np.array([row["probabilities"][n] for n in NAMES])
            np.testing.assert_allclose(got, expected, atol=1e-5)
            assert row["label"] == NAMES[int(expected.argmax())]
            assert row["score"] == pytest.approx(float(expected.max()), abs=1e-5)


def test_top_k_keeps_the_most_likely(server):
    reply = server.post("/v1/classify", {"input": TEXTS[0], "top_k": 1})
    row = reply.json()["data"][0]
    assert list(row["probabilities"]) == [row["label"]]


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"inputs": "a"}, 400, "input"),
    ({"input": "a", "top_k": 0}, 400, "top_k"),
    ({"input": "the cat " * 12}, 400, "input[0]"),
])
def test_bad_classify_request_names_the_field(server, body, status, param):
    reply = server.post("/v1/classify", body)
    assert reply.status == status
    assert reply.json()["error"]["param"] == param
    assert server.post("/v1/classify", {"input": "a cat"}).status == 200
