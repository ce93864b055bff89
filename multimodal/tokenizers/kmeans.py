"""Lloyd's k-means with k-means++ initialisation: the palette of
:class:`~multimodal.tokenizers.image.PixelTokenizer` and the codebooks of
:class:`~multimodal.tokenizers.codec.RVQ`."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["kmeans", "nearest_centre"]


def nearest_centre(x: Tensor, centres: Tensor, chunk: int = 65536) -> Tensor:
    """Index of the nearest centre (Euclidean distance) for each row of ``x``, computed
    ``chunk`` rows at a time."""
    return torch.cat([torch.cdist(part, centres).argmin(-1) for part in x.split(chunk)])


def kmeans(points: Tensor, k: int, iters: int = 30, seed: int = 0, *,
           generator: torch.Generator | None = None, chunk: int = 65536) -> Tensor:
    """Lloyd's k-means on (P, C) float points; returns (k, C) centres.

    Initialisation: k-means++ (each next centre drawn with probability proportional to
    the squared distance to the nearest chosen one) from ``generator``, or from a
    ``torch.Generator`` seeded with ``seed``, so the result is a function of
    (points, k, iters, seed) only. Each iteration assigns every point to its nearest
    centre and moves each centre to the mean of its points; a centre left without points
    moves to the point farthest from its own centre, so no centre is wasted. Stops early
    once an iteration changes nothing. Computed in float64 on the CPU; the centres come
    back in the dtype and on the device of ``points``.
    """
    if points.dim() != 2 or points.shape[0] < k:
        raise ValueError(f"k-means needs (points, channels) with at least k={k} points, "
                         f"got {tuple(points.shape)}")
    gen = generator if generator is not None else torch.Generator().manual_seed(seed)
    x = points.detach().double().cpu()
    centres = x[torch.randint(len(x), (1,), generator=gen)]
    nearest = ((x - centres[0]) ** 2).sum(-1)
    for _ in range(1, k):
        probs = nearest / nearest.sum() if nearest.sum() > 0 else torch.ones_like(nearest)
        pick = torch.multinomial(probs, 1, generator=gen)
        centres = torch.cat([centres, x[pick]])
        nearest = torch.minimum(nearest, ((x - x[pick]) ** 2).sum(-1))
    for _ in range(iters):
        assign = nearest_centre(x, centres, chunk)
        sums = torch.zeros_like(centres).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=k).to(x.dtype)[:, None]
        new = torch.where(counts > 0, sums / counts.clamp_min(1), centres)
        empty = (counts[:, 0] == 0).nonzero().flatten()
        if empty.numel():
            err = ((x - centres[assign]) ** 2).sum(-1)
            new[empty] = x[err.topk(empty.numel()).indices]
        if torch.equal(new, centres):
            break
        centres = new
    dtype = points.dtype if points.is_floating_point() else torch.float32
    return centres.to(device=points.device, dtype=dtype)
