"""Word2Vec (Mikolov et al. 2013): continuous bag-of-words and skip-gram with negative
sampling, as the lecture notes draw it (``v = E x``: a word's vector is its column of E).

Two tables: the input vectors ``E`` (``in_embed``, the word vectors one keeps) and the
output vectors ``U`` (``out_embed``, used only to score). For one training example the
hidden vector is

- CBOW: ``h = (1/C) sum_c E[c]``, the mean of the ``C`` context words' vectors, and the word
  to predict is the centre word;
- skip-gram: ``h = E[w]``, the centre word's vector, and the word to predict is one of its
  context words (one example per (centre, context) pair).

With the word to predict ``o`` and ``K`` noise words ``n_1..n_K`` drawn from the unigram
distribution to the power 3/4, the negative-sampling loss is

    L = -log s(U[o] . h) - sum_k log s(-U[n_k] . h),       s = the logistic sigmoid.

Its gradients, with ``y = 1`` for ``o`` and ``0`` for the noise words and
``g_j = y_j - s(U[t_j] . h)``:

    dL/dU[t_j] = -g_j h,        dL/dh = -sum_j g_j U[t_j].

:meth:`Word2Vec.sgd_step` applies ``-lr`` times these to the rows a batch touches with
``index_add_`` (no autograd, no dense gradient; rows gathered with ``index_select`` /
``embedding_bag``, several times faster on a CPU than advanced indexing), summing the
updates of a row that occurs several times in the batch. As in the reference C code, CBOW
hands ``dL/dh`` whole to each context word (``context_grad="full"``), not ``dL/dh / C``,
the exact gradient of the mean (``context_grad="mean"``). :meth:`Word2Vec.loss` is the same
loss through autograd (tests, and the sparse-embedding alternative measured in
``benchmarks/word2vec.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["Word2Vec", "Word2VecConfig"]


@dataclass
class Word2VecConfig:
    """``mode``: ``"cbow"`` or ``"skipgram"``; ``vocab_size`` words of ``dim`` dimensions;
    ``context_grad``: how CBOW's ``dL/dh`` reaches each context word (``"full"`` as the
    reference C code and gensim, ``"mean"`` the exact gradient)."""

    vocab_size: int = 1000
    dim: int = 100
    mode: Literal["cbow", "skipgram"] = "cbow"
    context_grad: Literal["full", "mean"] = "full"

    def __post_init__(self) -> None:
        if self.mode not in ("cbow", "skipgram"):
            raise ValueError(f"mode must be 'cbow' or 'skipgram', got {self.mode!r}")
        if self.context_grad not in ("full", "mean"):
            raise ValueError(f"context_grad must be 'full' or 'mean', got {self.context_grad!r}")
        if self.vocab_size < 1 or self.dim < 1:
            raise ValueError(f"vocab_size and dim must be >= 1, got {self.vocab_size}, "
                             f"{self.dim}")


class Word2Vec(nn.Module):
    """The two embedding tables of Word2Vec and its negative-sampling loss.

    Initialised as the reference code does: ``E ~ U(-0.5/D, 0.5/D)``, ``U = 0``.
    ``sparse=True`` makes both tables give sparse gradients (for ``torch.optim.SGD`` /
    ``SparseAdam`` through :meth:`loss`); :meth:`sgd_step` does not need it.
    """

    def __init__(self, config: Word2VecConfig, sparse: bool = False) -> None:
        super().__init__()
        self.config = config
        self.in_embed = nn.Embedding(config.vocab_size, config.dim, sparse=sparse)
        self.out_embed = nn.Embedding(config.vocab_size, config.dim, sparse=sparse)
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        d = self.config.dim
        with torch.no_grad():
            self.in_embed.weight.uniform_(-0.5 / d, 0.5 / d, generator=generator)
            self.out_embed.weight.zero_()

    @property
    def vectors(self) -> Tensor:
        """The (V, D) word vectors (the input table ``E``), detached."""
        return self.in_embed.weight.detach()

    def get_config(self) -> dict:
        return asdict(self.config)

    # -- the maths -------------------------------------------------------------------------
    def hidden(self, inputs: Tensor, mask: Tensor | None = None) -> Tensor:
        """``h`` (B, D): skip-gram's ``E[w]`` for ``inputs`` (B,); CBOW's mean of ``E[c]``
        over the context ``inputs`` (B, C) where ``mask`` (B, C) is true."""
        if self.config.mode == "skipgram":
            return self.in_embed(inputs)
        if mask is None:
            mask = torch.ones_like(inputs, dtype=torch.bool)
        m = mask.to(self.in_embed.weight.dtype)
        summed = (self.in_embed(inputs.clamp(min=0)) * m[..., None]).sum(1)
        return summed / m.sum(1, keepdim=True).clamp(min=1.0)

    def scores(self, h: Tensor, targets: Tensor) -> Tensor:
        """``U[t_j] . h`` (B, 1 + K) for ``targets`` (B, 1 + K): the word to predict first,
        then the noise words."""
        return torch.einsum("bkd,bd->bk", self.out_embed(targets), h)

    def loss(self, inputs: Tensor, targets: Tensor, mask: Tensor | None = None,
             valid: Tensor | None = None) -> Tensor:
        """Negative-sampling loss summed over the batch (see the module docstring).
        ``valid`` (B, 1 + K) leaves out noise words equal to the word to predict."""
        s = self.scores(self.hidden(inputs, mask), targets)
        y = torch.zeros_like(s)
        y[:, 0] = 1.0
        per = F.binary_cross_entropy_with_logits(s, y, reduction="none")
        if valid is not None:
            per = per * valid.to(per.dtype)
        return per.sum()

    @torch.no_grad()
    def sgd_step(self, inputs: Tensor, targets: Tensor, lr: float,
                 mask: Tensor | None = None, valid: Tensor | None = None) -> Tensor:
        """One fused SGD step of the negative-sampling loss on a batch: the closed-form
        gradients applied with ``index_add_`` to the rows the batch touches. Returns the
        batch's summed loss (before the step). Done in the weights' dtype whatever autocast
        is on (a ``bf16-mixed`` run): the update is arithmetic on the weights, not a layer's
        forward, and ``index_add_`` needs the update in their dtype."""
        with torch.autocast(self.in_embed.weight.device.type, enabled=False):
            return self._sgd_step(inputs, targets, lr, mask, valid)

    def _sgd_step(self, inputs: Tensor, targets: Tensor, lr: float,
                  mask: Tensor | None, valid: Tensor | None) -> Tensor:
        E, U = self.in_embed.weight, self.out_embed.weight
        d = E.shape[1]
        cbow = self.config.mode == "cbow"
        if cbow:
            if mask is None:
                mask = torch.ones_like(inputs, dtype=torch.bool)
            rows = inputs[mask]                               # the context words, row by row
            per_row = mask.sum(1)
            offsets = torch.cumsum(per_row, 0) - per_row
            count = per_row.clamp(min=1).to(E.dtype)[:, None]
            h = F.embedding_bag(rows, E, offsets, mode="sum") / count
        else:
            h = E.index_select(0, inputs)
        flat = targets.reshape(-1)
        u = U.index_select(0, flat).view(*targets.shape, d)  # (B, 1+K, D)
        s = (u * h[:, None]).sum(-1)
        g = -torch.sigmoid(s)
        g[:, 0] += 1.0                                        # y - s(score)
        if valid is not None:
            g = g * valid.to(g.dtype)
        # loss before the step, log s(x) = -softplus(-x)
        signed = torch.cat([s[:, :1], -s[:, 1:]], dim=1)
        per = F.softplus(-signed)
        loss = (per * valid.to(per.dtype)).sum() if valid is not None else per.sum()
        g = g * lr
        grad_h = torch.bmm(g[:, None], u).squeeze(1)          # -lr dL/dh
        U.index_add_(0, flat, (g[..., None] * h[:, None]).reshape(-1, d))
        if cbow:
            if self.config.context_grad == "mean":
                grad_h = grad_h / count
            owner = torch.repeat_interleave(torch.arange(h.shape[0]), per_row)
            E.index_add_(0, rows, grad_h.index_select(0, owner))
        else:
            E.index_add_(0, inputs, grad_h)
        return loss
