"""``multimodal serve`` on a tiny random-weight CLIP of ours: /v1/zero-shot against
``mm.zero_shot`` over the same images as files and against ``CLIP.zero_shot`` (the model's
own prompt ensemble), an image alone equal to the same image in a batch, label sets mixed
in one batch, and every fault a 4xx naming its field; SigLIP's sigmoid in-process."""

from __future__ import annotations

import base64
import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from tests.serve.conftest import tiny_clip_folder
from tests.serve.running import Server

LABELS = ["cat", "dog", "red square", "blue circle"]
TEMPLATES = ["a photo of a {}.", "a {}"]


def png(seed: int, size: tuple[int, int] = (40, 48)) -> bytes:
    from PIL import Image

    g = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(g.integers(0, 256, (*size, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def url(raw: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(raw).decode()


IMAGES = [png(i, (40 + 8 * i, 48)) for i in range(5)]


def probabilities(reply, labels: list[str]) -> np.ndarray:
    return np.array([[row["probabilities"][n] for n in labels] for row in reply.json()["data"]])


@pytest.fixture(scope="module")
def server(tiny_clip):
    srv = Server(tiny_clip, "--batch_timeout_ms", "100")
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def offline(tiny_clip, tmp_path_factory) -> np.ndarray:
    """``mm.zero_shot`` over the images written as PNG files, (5, 4)."""
    import multimodal as mm

    folder = tmp_path_factory.mktemp("photos")
    for i, raw in enumerate(IMAGES):
        (folder / f"{i}.png").write_bytes(raw)
    rows = mm.zero_shot(str(tiny_clip), folder, LABELS, TEMPLATES, stream=io.StringIO())
    assert [r.id for r in rows] == [f"{i}.png" for i in range(5)]
    return np.array([r.probabilities for r in rows])


def test_zero_shot_equals_mm_zero_shot_and_the_models_own_prompt_ensemble(
        server, offline, tiny_clip):
    from PIL import Image

    import multimodal as mm

    reply = server.post("/v1/zero-shot", {"input": [url(b) for b in IMAGES], "labels": LABELS,
                                          "templates": TEMPLATES, "model": "mine"})
    assert reply.status == 200, reply.body
    body = reply.json()
    assert body["model"] == "mine" and body["activation"] == "softmax"
    got = probabilities(reply, LABELS)
    np.testing.assert_allclose(got, offline, atol=1e-5)
    np.testing.assert_allclose(got.sum(1), 1, atol=1e-5)
    encoder = mm.load_encoder(tiny_clip)  # CLIP.zero_shot: its own tokenisation and maths
    pixels = encoder.preprocess([Image.open(io.BytesIO(b)).convert("RGB") for b in IMAGES])
    want = encoder.backbone.zero_shot(pixels, LABELS, TEMPLATES, tokenizer=encoder.tokenizer)
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)
    for row, p in zip(body["data"], got, strict=True):  # most likely first, label = top
        assert list(row["probabilities"]) == [LABELS[j] for j in np.argsort(-p, kind="stable")]
        assert row["label"] == LABELS[int(p.argmax())]
        assert row["score"] == pytest.approx(float(p.max()))


def test_an_image_alone_equals_the_same_image_in_a_batch(server, offline):
    bodies = [{"input": url(b), "labels": LABELS, "templates": TEMPLATES} for b in IMAGES]
    bodies.append({"input": [{"image_url": {"url": url(b)}} for b in IMAGES[::-1]],
                   "labels": LABELS, "templates": TEMPLATES})
    with ThreadPoolExecutor(len(bodies)) as pool:
        replies = list(pool.map(lambda b: server.post("/v1/zero-shot", b), bodies))
    assert all(r.status == 200 for r in replies), [r.body for r in replies]
    assert max(int(r.headers["x-batch-requests"]) for r in replies) > 1  # they shared a batch
    alone = np.concatenate([probabilities(r, LABELS) for r in replies[:-1]])
    np.testing.assert_allclose(alone, offline, atol=1e-5)
    np.testing.assert_allclose(probabilities(replies[-1], LABELS), offline[::-1], atol=1e-5)


def test_label_sets_in_one_batch_each_get_their_own(server, tiny_clip):
    import multimodal as mm

    sets = [["cat", "dog"], ["dog", "cat", "circle"], ["red square", "a circle"]]
    bodies = [{"input": url(IMAGES[i % 5]), "labels": sets[i % 3]} for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda b: server.post("/v1/zero-shot", b), bodies))
    encoder = mm.load_encoder(tiny_clip)
    from PIL import Image

    for i, (body, reply) in enumerate(zip(bodies, replies, strict=True)):
        assert reply.status == 200, reply.body
        pixels = encoder.preprocess([Image.open(io.BytesIO(IMAGES[i % 5])).convert("RGB")])
        want = encoder.backbone.zero_shot(pixels, body["labels"], tokenizer=encoder.tokenizer)
        np.testing.assert_allclose(probabilities(reply, body["labels"]), want.numpy(),
                                   atol=1e-5)


def test_top_k_keeps_the_most_likely(server, offline):
    reply = server.post("/v1/zero-shot", {"input": url(IMAGES[0]), "labels": LABELS,
                                          "templates": TEMPLATES, "top_k": 2})
    assert reply.status == 200, reply.body
    kept = reply.json()["data"][0]["probabilities"]
    order = np.argsort(-offline[0])[:2]
    assert list(kept) == [LABELS[j] for j in order]


GOOD = {"input": url(IMAGES[0]), "labels": ["cat", "dog"]}


@pytest.mark.parametrize("body,param", [
    ({"input": url(IMAGES[0])}, "labels"),
    ({**GOOD, "labels": "cat,dog"}, "labels"),
    ({**GOOD, "labels": ["cat"]}, "labels"),
    ({**GOOD, "labels": []}, "labels"),
    ({**GOOD, "labels": ["cat", "  "]}, "labels[1]"),
    ({**GOOD, "labels": ["cat", 3]}, "labels[1]"),
    ({**GOOD, "labels": ["cat", "dog", " cat"]}, "labels[2]"),
    ({**GOOD, "templates": ["a photo"]}, "templates[0]"),
    ({**GOOD, "templates": ["{} {}"]}, "templates[0]"),
    ({**GOOD, "templates": []}, "templates"),
    ({**GOOD, "top_k": 0}, "top_k"),
    ({"labels": ["cat", "dog"]}, "input"),
    ({**GOOD, "input": [url(IMAGES[0]), url(b"not a png")]}, "input[1]"),
    ({**GOOD, "input": "a photo of a cat"}, "input[0]"),
    ({**GOOD, "input": [{"image_url": {"url": "https://example.com/cat.png"}}]}, "input[0]"),
    ({**GOOD, "input": []}, "input"),
])
def test_bad_zero_shot_request_is_400_naming_the_field(server, body, param):
    reply = server.post("/v1/zero-shot", body)
    assert reply.status == 400, reply.body
    assert reply.json()["error"]["param"] == param, reply.body
    assert server.post("/v1/zero-shot", GOOD).status == 200  # and it serves on


def test_malformed_json_is_400_and_embeddings_are_served_beside(server, tiny_clip):
    import multimodal as mm

    served = server.get("/v1/models").json()["data"][0]
    assert served["endpoints"] == ["/v1/embeddings", "/v1/zero-shot"]
    assert server.post("/v1/zero-shot", "{not json").status == 400
    reply = server.post("/v1/embeddings", {"input": ["a cat", url(IMAGES[1])]})
    assert reply.status == 200, reply.body
    got = np.array([d["embedding"] for d in reply.json()["data"]])
    encoder = mm.load_encoder(tiny_clip)
    from PIL import Image

    want = torch.cat([encoder.encode(["a cat"]),
                      encoder.encode([Image.open(io.BytesIO(IMAGES[1])).convert("RGB")])])
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)


def hf_clip_folder(folder):
    """A transformers CLIPModel folder with random weights, its CLIPImageProcessor and a
    word-level tokenizer.json."""
    transformers = pytest.importorskip("transformers")
    from tests.pretrained_folders import clip_folder, word_tokenizer

    clip_folder(folder)
    transformers.CLIPImageProcessor(size={"shortest_edge": 32},
                                    crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    return word_tokenizer(folder)


def contrastive_checkpoint(folder, path):
    """A ``.ckpt`` as the contrastive task writes it (state dict under ``model.``, the
    tokenizer as JSON) of the CLIP saved in ``folder``."""
    from multimodal.encoder import load_encoder
    from multimodal.tasks.contrastive import ContrastiveTask

    encoder = load_encoder(folder)
    task = ContrastiveTask(encoder.backbone)
    task.tokenizer = encoder.tokenizer
    ckpt = {"state_dict": task.state_dict(), "hyper_parameters": {}}
    task.on_save_checkpoint(ckpt)
    torch.save(ckpt, path)
    return path


@pytest.mark.parametrize("which", [
    "siglip", "hf_clip",
    # its image normalisation measured again by the data module, three times: 11 s
    pytest.param("task_ckpt", marks=pytest.mark.slow)])
def test_the_worker_equals_mm_zero_shot_on_siglip_a_transformers_clip_and_a_checkpoint(
        tmp_path, tiny_clip, which):
    """The worker in-process (no server): a SigLIP of ours (per-label sigmoids), a
    transformers CLIP folder and a contrastive task checkpoint (softmax), each as
    ``mm.zero_shot`` gives it offline."""
    import multimodal as mm
    from multimodal.pipelines._loaders import served
    from multimodal.serve.embeddings import TextRules
    from multimodal.serve.models import kind_of
    from multimodal.serve.zero_shot import ClipAPI, ClipSpec, parse_zero_shot

    folder = {"siglip": lambda: tiny_clip_folder(tmp_path / "siglip", loss="sigmoid"),
              "hf_clip": lambda: hf_clip_folder(tmp_path / "hf_clip"),
              "task_ckpt": lambda: contrastive_checkpoint(tiny_clip, tmp_path / "clip.ckpt"),
              }[which]()
    assert kind_of(folder) == "embed"
    labels = LABELS if which == "siglip" else ["red", "blue circle", "small square"]
    (tmp_path / "photos").mkdir()
    for i, raw in enumerate(IMAGES[:3]):
        (tmp_path / "photos" / f"{i}.png").write_bytes(raw)
    want = np.array([r.probabilities for r in mm.zero_shot(
        str(folder), tmp_path / "photos", labels, stream=io.StringIO())])
    rules = TextRules.of(served(folder, "embed")[0])  # as the server builds them
    activation = "sigmoid" if which == "siglip" else "softmax"
    api = ClipAPI(str(folder), ClipSpec(rules, which, activation))
    api.setup("cpu")
    job, _, _ = parse_zero_shot({"input": [url(b) for b in IMAGES[:3]], "labels": labels},
                                rules)
    (got, batched), = api.predict([job])
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert batched == 1
    assert np.allclose(got.sum(1), 1) is (which != "siglip")  # SigLIP: sigmoids


@pytest.mark.parametrize("which,says", [
    ("encoder", "is none (served as 'embed')"),
    ("bare_clip", "has no image preprocessing"),
])
def test_zero_shot_of_a_model_that_cannot_is_a_404_that_says_why(tmp_path, tiny_encoder,
                                                                   which, says):
    """Built as ``multimodal serve`` builds it, asked in-process (no worker is started): a
    text encoder, and a CLIP saved without its image preprocessing (texts only)."""
    from fastapi.testclient import TestClient

    from multimodal.serve.server import ServeConfig, build_server

    model = tiny_encoder if which == "encoder" else \
        tiny_clip_folder(tmp_path / "bare", preprocessor=False)
    client = TestClient(build_server(ServeConfig(model=str(model))).server.app)
    reply = client.post("/v1/zero-shot", json=GOOD)
    assert reply.status_code == 404
    message = reply.json()["error"]["message"]
    assert "needs a CLIP / SigLIP" in message and says in message, message
    if which == "bare_clip":
        refused = client.post("/v1/embeddings", json={"input": [url(IMAGES[0])]})
        assert refused.status_code == 400
        assert "no image preprocessing" in refused.json()["error"]["message"]


def test_label_sets_are_computed_once_and_the_cache_is_bounded(tmp_path, tiny_clip):
    """In-process: a label set's class embeddings are reused (the same object), the least
    recently used set is dropped past ``cache_size``, and a lone request (``max_batch_size``
    1: no list around it) is answered as in a batch."""
    import multimodal as mm
    from multimodal.serve.embeddings import TextRules
    from multimodal.serve.zero_shot import ClipAPI, ClipSpec, parse_zero_shot

    rules = TextRules.of(mm.load_encoder(tiny_clip))
    api = ClipAPI(str(tiny_clip), ClipSpec(rules, "clip", "softmax"), cache_size=2)
    api.setup("cpu")
    jobs = [parse_zero_shot({"input": url(IMAGES[0]), "labels": labels}, rules)[0]
            for labels in (["cat", "dog"], ["dog", "cat"], ["red", "blue"])]
    first = api.head(jobs[0].labels, jobs[0].templates)
    assert api.head(jobs[0].labels, jobs[0].templates) is first
    alone, batched = api.predict(jobs[1])
    assert batched == 1
    (together, n), *_ = api.predict([jobs[1], jobs[0]])
    assert n == 2
    np.testing.assert_allclose(alone, together, atol=1e-6)
    # [cat, dog] was used last: a third set drops [dog, cat], the least recently used
    api.head(jobs[2].labels, jobs[2].templates)
    assert list(api.heads) == [(jobs[0].labels, jobs[0].templates),
                               (jobs[2].labels, jobs[2].templates)]
