"""PixelTokenizer: grey levels (exact at 256), k-means palettes, files, bad input."""

from __future__ import annotations

import pytest
import torch

from multimodal.tokenizers.image import PixelTokenizer
from multimodal.tokenizers.kmeans import kmeans


def test_256_levels_token_is_the_pixel_value() -> None:
    images = torch.randint(0, 256, (3, 7, 5), dtype=torch.uint8)
    tok = PixelTokenizer(levels=256)
    ids = tok.encode(images)
    assert ids.dtype == torch.long
    assert torch.equal(ids, images.long())
    assert torch.equal(tok.decode(ids), images)
    # every value 0..255 round-trips
    every = torch.arange(256, dtype=torch.uint8).view(1, 16, 16)
    assert torch.equal(tok.decode(tok.encode(every)), every)


def test_raster_order_and_channel_dim() -> None:
    images = torch.tensor([[[[1, 2, 3], [4, 5, 6]]]], dtype=torch.uint8)  # (1, 1, 2, 3)
    tok = PixelTokenizer(256)
    assert tok.encode(images, flatten=True).tolist() == [[1, 2, 3, 4, 5, 6]]
    assert torch.equal(tok.decode(tok.encode(images, flatten=True), image_size=(2, 3)),
                       images[:, 0])


def test_fewer_levels_uniform_bins_and_centres() -> None:
    tok = PixelTokenizer(levels=4)  # bins of 64: [0, 64) -> 0, ..., [192, 256) -> 3
    pixels = torch.tensor([0, 63, 64, 127, 128, 191, 192, 255], dtype=torch.uint8)
    assert tok.encode(pixels).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert tok.decode(torch.arange(4)).tolist() == [32, 96, 160, 224]  # bin centres
    # decode then encode gives the same tokens for any K
    for k in (2, 3, 7, 16, 100, 255):
        t = PixelTokenizer(levels=k)
        ids = torch.arange(k)
        assert torch.equal(t.encode(t.decode(ids)), ids), k
        # the decoded value lies inside its bin
        centres = t.decode(ids).long()
        assert bool((centres * k // 256 == ids).all())


def _clustered_rgb(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    colours = torch.tensor([[10, 20, 30], [200, 40, 40], [30, 220, 90], [250, 250, 250]])
    which = torch.randint(0, 4, (6, 8, 8), generator=gen)
    noise = torch.randint(-3, 4, (6, 8, 8, 3), generator=gen)
    rgb = (colours[which] + noise).clamp(0, 255).to(torch.uint8).permute(0, 3, 1, 2)
    return rgb, colours


def test_kmeans_palette_recovers_clusters_and_is_deterministic() -> None:
    images, colours = _clustered_rgb()
    a = PixelTokenizer.fit_palette(images, num_colors=4, seed=3)
    b = PixelTokenizer.fit_palette(images, num_colors=4, seed=3)
    assert a == b
    assert a.vocab_size == 4
    # each true colour has a palette entry within the noise (+-3 per channel)
    dist = torch.cdist(colours.float(), a.palette.float())
    assert float(dist.min(dim=1).values.max()) < 3 * 3**0.5
    recon = a.decode(a.encode(images))
    assert recon.shape == images.shape
    assert int((recon.long() - images.long()).abs().max()) <= 6
    # palette colours themselves round-trip exactly
    ids = torch.arange(a.vocab_size).view(1, 1, -1)
    assert torch.equal(a.encode(a.decode(ids)), ids)


def test_kmeans_matches_lloyd_definition() -> None:
    # two well separated 1-D groups: the centres are the group means
    pts = torch.tensor([[0.0], [1.0], [2.0], [10.0], [11.0], [12.0], [13.0]])
    centres = kmeans(pts, 2, seed=0).sort(dim=0).values
    assert torch.allclose(centres, torch.tensor([[1.0], [11.5]]))


def test_palette_with_few_colours_is_exact() -> None:
    images, _ = _clustered_rgb()
    images = images[:, :, :2, :2]  # at most 24 distinct colours
    tok = PixelTokenizer.fit_palette(images, num_colors=512)
    assert torch.equal(tok.decode(tok.encode(images)), images)


def test_save_load_round_trip(tmp_path) -> None:
    grey = PixelTokenizer(levels=16)
    assert PixelTokenizer.load(grey.save(tmp_path / "grey.json")) == grey
    images, _ = _clustered_rgb()
    pal = PixelTokenizer.fit_palette(images, num_colors=4)
    loaded = PixelTokenizer.load(pal.save(tmp_path / "pal.json"))
    assert torch.equal(loaded.palette, pal.palette)
    assert torch.equal(loaded.encode(images), pal.encode(images))
    assert "palette" in (tmp_path / "pal.json").read_text()  # JSON, not pickle


def test_bad_input() -> None:
    tok = PixelTokenizer(256)
    with pytest.raises(ValueError, match=r"0\.\.255"):
        tok.encode(torch.tensor([[0, 256]]))
    with pytest.raises(ValueError, match=r"0\.\.255"):
        tok.encode(torch.tensor([[-1, 3]]))
    with pytest.raises(ValueError, match="integer pixel values"):
        tok.encode(torch.rand(2, 4, 4))
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        PixelTokenizer(16).decode(torch.tensor([[16]]))
    with pytest.raises(ValueError, match="levels"):
        PixelTokenizer(levels=1)
    with pytest.raises(ValueError, match="levels"):
        PixelTokenizer(levels=257)
    with pytest.raises(ValueError, match="RGB"):
        PixelTokenizer.fit_palette(torch.zeros(2, 1, 4, 4, dtype=torch.uint8))
    with pytest.raises(FileNotFoundError):
        PixelTokenizer.load("/nonexistent/tok.json")
