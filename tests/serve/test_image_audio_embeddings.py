"""/v1/embeddings for an image encoder (a tiny random transformers ViT folder with its
``preprocessor_config.json``) and an audio encoder (a tiny AST folder): images and clips
sent as data URLs / parts equal ``Encoder.encode`` offline; unreadable ones are a 400
naming ``input[i]``."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import soundfile as sf
import torch

from tests.serve.running import Server

pytest.importorskip("transformers")


def png(seed: int, size: int = 40) -> bytes:
    from PIL import Image

    g = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(g.integers(0, 256, (size, size + 8, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def data_url(raw: bytes, media: str) -> str:
    return f"data:{media};base64," + base64.b64encode(raw).decode()


def rows(reply) -> np.ndarray:
    return np.array([d["embedding"] for d in reply.json()["data"]], dtype=np.float32)


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    from tests.pretrained_folders import vit_folder

    return vit_folder(tmp_path_factory.mktemp("serve") / "vit")


@pytest.mark.slow  # a server of its own: kept out of the default run
def test_images_as_data_urls_and_parts_equal_encode_offline(vit):
    from PIL import Image

    import multimodal as mm

    images = [png(0), png(1, 24)]
    srv = Server(vit, "--max_batch_size", "4")
    try:
        reply = srv.post("/v1/embeddings", {"input": [
            data_url(images[0], "image/png"),
            {"type": "image_url", "image_url": {"url": data_url(images[1], "image/png")}}]})
        assert reply.status == 200, reply.body
        bad = [({"input": [data_url(b"not a png", "image/png")]}, "input[0]"),
               ({"input": ["a text", data_url(images[0], "image/png")]}, "input[0]"),
               ({"input": [{"image_url": "https://example.com/cat.png"}]}, "input[0]")]
        for body, param in bad:
            refused = srv.post("/v1/embeddings", body)
            assert refused.status == 400, refused.body
            assert refused.json()["error"]["param"] == param
        assert srv.post("/v1/embeddings", {"input": data_url(images[0], "image/png")}) \
            .status == 200
    finally:
        assert srv.stop() == 0
    encoder = mm.load_encoder(vit)
    want = encoder.encode([Image.open(io.BytesIO(b)).convert("RGB") for b in images])
    np.testing.assert_allclose(rows(reply), want.numpy(), atol=1e-5)


@pytest.mark.slow
def test_audio_clips_as_parts_equal_encode_offline(tmp_path):
    import multimodal as mm
    from tests.pretrained_folders import ast_folder

    folder = ast_folder(tmp_path / "ast")
    g = np.random.default_rng(0)
    clips = [(0.3 * g.standard_normal(n)).astype(np.float32) for n in (8000, 12000)]
    wavs = []
    for clip in clips:
        buf = io.BytesIO()
        sf.write(buf, clip, 16000, format="WAV", subtype="FLOAT")
        wavs.append(buf.getvalue())
    srv = Server(folder)
    try:
        reply = srv.post("/v1/embeddings", {"input": [
            data_url(wavs[0], "audio/wav"),
            {"type": "input_audio", "input_audio": {"data": base64.b64encode(wavs[1]).decode(),
                                                    "format": "wav"}}]})
        bad = srv.post("/v1/embeddings", {"input": [data_url(b"RIFF....", "audio/wav")]})
    finally:
        assert srv.stop() == 0
    assert reply.status == 200, reply.body
    assert bad.status == 400 and bad.json()["error"]["param"] == "input[0]"
    want = mm.load_encoder(folder).encode([torch.from_numpy(c) for c in clips],
                                          sample_rate=16000)
    np.testing.assert_allclose(rows(reply), want.numpy(), atol=1e-5)
