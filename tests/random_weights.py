"""Random weights of order one, for the decoding tests: a model whose next-token
distributions differ visibly from step to step and whose best tokens are separated by clear
margins, not the near-ties of the small training init."""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)


def o1_weights(model: M, *unit: str, head: float | None = None) -> M:
    """Redraw ``model``'s weights in place, in this order (the draws of a seeded generator
    are the same for the same call): every 2-D parameter ``W`` (out, in) from
    ``N(0, 1 / in)`` (a unit-variance input gives unit-variance outputs), then each named
    embedding (``"tok_embed"``, ``"pos_embed"``) from ``N(0, 1)``, then, with ``head``,
    ``lm_head`` from ``N(0, head ** 2)``. Returns ``model``."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, p.shape[1] ** -0.5)
        for name in unit:
            getattr(model, name).weight.normal_(0.0, 1.0)
        if head is not None:
            model.lm_head.weight.normal_(0.0, head)
    return model
