"""torchvision's VisionTransformer converted to our ViT gives torchvision's outputs (fp32,
atol 1e-4); sources are built with random weights from small configs (no download)."""

import pytest
import torch

import multimodal as mm
from multimodal import convert
from tests.convert.sources import random_images, randomise_layer_norms

torchvision = pytest.importorskip("torchvision")

from torchvision.models.vision_transformer import VisionTransformer as TorchvisionViT  # noqa: E402

# Ours and the peer compute the same maths in float32 in another order of operations:
# an absolute floor for values near zero plus float32's relative resolution (torch's default
# rtol, about ten ulps) so that the tolerance scales with the outputs' magnitude.
ATOL = 1e-4
RTOL = 1.3e-6


def small_torchvision(**kw) -> TorchvisionViT:
    args = dict(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                mlp_dim=64, num_classes=5)
    torch.manual_seed(0)
    model = TorchvisionViT(**{**args, **kw})
    with torch.no_grad():  # torchvision zero-initialises the head and the class token
        model.heads.head.weight.normal_(0, 0.2)
        model.class_token.normal_(0, 0.2)
    return randomise_layer_norms(model)


def test_torchvision_small_matches():
    source = small_torchvision()
    ours = convert.from_torchvision(source)
    assert isinstance(ours, mm.ViT)
    assert ours.config.norm_eps == 1e-6 and ours.config.heads == 2
    x = random_images()
    with torch.no_grad():
        want = source(x)
        got = ours(x)
    assert got.shape == (2, 5)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
    assert want.abs().max() > 0.1  # the comparison is not between two near-zero tensors


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vit_b_16", "vit_b_32"])
def test_torchvision_real_sizes_match(name):
    source = randomise_layer_norms(getattr(torchvision.models, name)(weights=None))
    with torch.no_grad():
        source.heads.head.weight.normal_(0, 0.02)
    ours = convert.from_torchvision(source)
    assert ours.config.dim == 768 and ours.config.depth == 12
    x = random_images(224, batch=1)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), source(x), atol=ATOL, rtol=RTOL)
