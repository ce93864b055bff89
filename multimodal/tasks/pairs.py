"""The pair loss of contrastive few-shot fine-tuning (SetFit, Tunstall et al. 2022).

SetFit fine-tunes a sentence encoder on pairs of labelled examples: a pair of the same
class has target 1, a pair of different classes target 0, and the loss is the squared
error between the cosine similarity of the two embeddings and the target
(sentence-transformers' ``CosineSimilarityLoss``), with as many positive as negative
pairs. Here the pairs are every pair of a batch, ``i < j``, weighed so that positives and
negatives count equally, which is that loss's expectation under 50/50 sampling:

    c_ij = u_i . u_j / (||u_i|| ||u_j||)
    L = 1/2 mean_{i<j, y_i = y_j} (c_ij - 1)^2  +  1/2 mean_{i<j, y_i != y_j} c_ij^2

(a batch without positive or without negative pairs uses the mean of the other set
alone). Any encoder and any labels: nothing here knows the modality.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["pair_loss"]


def pair_loss(embeddings: Tensor, labels: Tensor) -> Tensor:
    """``L`` of the module docstring for ``embeddings`` (B, D) and ``labels`` (B,)."""
    if embeddings.dim() != 2 or labels.shape != embeddings.shape[:1]:
        raise ValueError(f"embeddings must be (B, D) with labels (B,), got "
                         f"{tuple(embeddings.shape)} and {tuple(labels.shape)}")
    z = F.normalize(embeddings.float(), dim=-1)
    cos = z @ z.T
    upper = torch.ones_like(cos, dtype=torch.bool).triu(diagonal=1)
    same = labels[:, None] == labels[None, :]
    terms = [((cos[same & upper] - 1) ** 2).mean() if bool((same & upper).any()) else None,
             (cos[~same & upper] ** 2).mean() if bool((~same & upper).any()) else None]
    present = [t for t in terms if t is not None]
    if not present:  # a batch of one example: no pair
        return cos.sum() * 0.0
    return torch.stack(present).mean()
