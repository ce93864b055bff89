"""A solved linear probe: multinomial logistic regression on frozen features, fitted to its
optimum by L-BFGS (full batch, in torch), its L2 strength chosen by k-fold cross-validation.

The problem (scikit-learn's ``LogisticRegression`` with ``C``, divided by ``S``: the same
minimiser). Features ``x_i`` (D,), labels ``y_i`` in 0..K-1, sample weights ``s_i``
(class weights: ``"balanced"`` gives ``s_i = N / (K N_{y_i})``, 1 on balanced data),
``S = sum_i s_i``, weights ``W`` (K, D), bias ``b`` (K,) (not penalised):

    z_i = W x_i + b,        p_i = softmax(z_i)
    f(W, b) = (1/S) sum_i s_i (-log p_{i, y_i})  +  ||W||_F^2 / (2 C S)

``f`` is convex (strictly in ``W``); its gradient, with ``Y`` the one-hot labels,

    df/dW = (1/S) sum_i s_i (p_i - Y_i) x_i^T  +  W / (C S)
    df/db = (1/S) sum_i s_i (p_i - Y_i)

vanishes at the optimum. :func:`fit_logistic` minimises ``f`` with
``torch.optim.LBFGS`` (strong-Wolfe line search) until the largest gradient entry is below
``tol``. :func:`fit_probe` picks ``C`` from a grid by stratified k-fold cross-validation on
the training set (the mean held-out accuracy; among equal accuracies the lower held-out
cross-entropy, where ``LogisticRegressionCV`` takes the smaller ``C``: with few examples
the folds often tie at 100 %, and the smallest ``C`` then gives near-uniform
probabilities), warm-starting along the grid, then refits on every example.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["DEFAULT_CS", "ProbeFit", "fit_logistic", "fit_probe", "probe_weights",
           "stratified_folds"]

DEFAULT_CS = tuple(10.0 ** (-4 + 8 * i / 9) for i in range(10))
"""``C`` grid: 10 values log-spaced over 1e-4 .. 1e4 (``LogisticRegressionCV(Cs=10)``)."""


ABSENT_MARGIN = 30.0
"""A class absent from the training labels gets zero weights and a bias this far below the
smallest fitted one: probability ``< e^-30`` times the least likely class present."""


@dataclass
class ProbeFit:
    """A fitted probe: ``weight`` (K, D), ``bias`` (K,), the ``C`` chosen, the mean
    cross-validated accuracy per grid value (``cv_accuracy``, empty without
    cross-validation) and the L-BFGS iterations of the final fit."""

    weight: Tensor
    bias: Tensor
    C: float
    cv_accuracy: list[float]
    iterations: int


def probe_weights(labels: Tensor, num_classes: int, class_weight: str | None) -> Tensor:
    """Sample weights ``(N,)``: ones, or ``"balanced"``: ``N / (K N_c)`` for class c
    (scikit-learn's ``class_weight="balanced"``; every class then weighs the same)."""
    if class_weight is None or class_weight == "none":
        return torch.ones(labels.shape[0], dtype=torch.float64, device=labels.device)
    if class_weight != "balanced":
        raise ValueError(f"class_weight must be 'balanced' or None, got {class_weight!r}")
    counts = torch.bincount(labels, minlength=num_classes).to(torch.float64)
    present = int((counts > 0).sum())
    per_class = labels.shape[0] / (present * counts.clamp(min=1))
    return per_class[labels]


def _objective(x: Tensor, onehot: Tensor, s: Tensor, weight: Tensor, bias: Tensor,
               C: float) -> tuple[Tensor, Tensor, Tensor]:
    """The sum over problems ``r`` of ``f_r`` and its gradient (module docstring), written
    out (no autograd graph): ``x`` (N, D) shared, ``s`` (R, N) each problem's sample
    weights (0 leaves a row out), ``weight`` (R, K, D), ``bias`` (R, K)."""
    total = s.sum(-1)  # (R,)
    logits = torch.baddbmm(bias[:, None], x.expand(weight.shape[0], -1, -1),
                           weight.transpose(1, 2))  # (R, N, K)
    logp = torch.log_softmax(logits, dim=-1)
    nll = -(logp * onehot).sum(-1)  # (R, N)
    penalty = weight.pow(2).sum((1, 2)) / (2 * C * total)
    loss = ((s * nll).sum(-1) / total + penalty).sum()
    g = (logp.exp() - onehot) * (s / total[:, None])[..., None]  # (R, N, K)
    grad_w = torch.matmul(g.transpose(1, 2), x) + weight / (C * total)[:, None, None]
    return loss, grad_w, g.sum(1)


def _lbfgs(x: Tensor, labels: Tensor, s: Tensor, num_classes: int, C: float,
           init: tuple[Tensor, Tensor] | None, max_iter: int,
           tol: float) -> tuple[Tensor, Tensor, int]:
    """R independent problems (``s`` (R, N)) solved as one: ``f`` is their sum, so its
    minimiser is theirs; one L-BFGS run for all (cross-validation folds at once)."""
    dtype, runs = x.dtype, s.shape[0]
    if init is None:
        weight = torch.zeros(runs, num_classes, x.shape[1], dtype=dtype, device=x.device)
        bias = torch.zeros(runs, num_classes, dtype=dtype, device=x.device)
    else:
        weight, bias = (t.detach().to(dtype).clone() for t in init)
    onehot = F.one_hot(labels, num_classes).to(dtype)
    opt = torch.optim.LBFGS([weight, bias], lr=1.0, max_iter=max_iter, history_size=20,
                            tolerance_grad=tol, tolerance_change=0.0,
                            line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        loss, weight.grad, bias.grad = _objective(x, onehot, s, weight, bias, C)
        return loss

    opt.step(closure)
    return weight.detach(), bias.detach(), int(opt.state[weight].get("n_iter", 0))


def fit_logistic(features: Tensor, labels: Tensor, num_classes: int, C: float = 1.0,
                 sample_weight: Tensor | None = None,
                 init: tuple[Tensor, Tensor] | None = None, max_iter: int = 1000,
                 tol: float = 1e-6) -> tuple[Tensor, Tensor, int]:
    """``(W (K, D), b (K,), iterations)`` minimising ``f`` of the module docstring for one
    ``C``, by L-BFGS from ``init`` (zeros by default) until the largest gradient entry is
    below ``tol``. Computes in ``features``' dtype."""
    if features.dim() != 2 or labels.shape != features.shape[:1]:
        raise ValueError(f"features must be (N, D) with labels (N,), got "
                         f"{tuple(features.shape)} and {tuple(labels.shape)}")
    if not C > 0:
        raise ValueError(f"C must be > 0, got {C}")
    x = features
    s = torch.ones(x.shape[0], dtype=x.dtype, device=x.device) if sample_weight is None \
        else sample_weight.to(x.dtype)
    start = None if init is None else (init[0][None], init[1][None])
    with _cpu_threads(x, num_classes):
        w, b, iters = _lbfgs(x, labels.long(), s[None], num_classes, C, start, max_iter, tol)
    return w[0], b[0], iters


def stratified_folds(labels: Tensor, folds: int, seed: int = 0) -> list[Tensor]:
    """``folds`` disjoint index sets covering ``labels``, each class spread over them as
    evenly as it divides (the held-out part of each fold; shuffled with ``seed``)."""
    gen = torch.Generator().manual_seed(seed)
    y = labels.cpu()
    parts: list[list[Tensor]] = [[] for _ in range(folds)]
    offset = 0
    for c in torch.unique(y).tolist():
        idx = (y == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=gen)]
        for j, chunk in enumerate(torch.tensor_split(idx, folds)):
            parts[(j + offset) % folds].append(chunk)
        offset += len(idx) % folds  # the larger chunks rotate over the folds
    return [torch.cat(p).sort().values for p in parts]


@contextmanager
def _cpu_threads(x: Tensor, num_classes: int) -> Iterator[None]:
    """One intra-op thread for a small CPU problem (under ~1e7 multiply-adds per
    evaluation the thread pool costs more than it saves, many times more on a busy
    machine); the count is restored after."""
    before = torch.get_num_threads()
    small = x.device.type == "cpu" and x.numel() * num_classes < 10_000_000
    if small:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if small:
            torch.set_num_threads(before)


def _solve_dtype(device: torch.device) -> torch.dtype:
    return torch.float64 if device.type in ("cpu", "cuda") else torch.float32


def fit_probe(features: Tensor, labels: Tensor, num_classes: int,
              Cs: tuple[float, ...] | list[float] | None = None, folds: int = 5,
              class_weight: str | None = "balanced", seed: int = 0,
              max_iter: int = 1000, tol: float = 1e-6) -> ProbeFit:
    """The probe of the module docstring on ``features`` (N, D) and ``labels`` (N,):
    ``C`` from ``Cs`` (default :data:`DEFAULT_CS`) by ``folds``-fold stratified
    cross-validation (fewer folds when the smallest class has fewer examples; none with a
    single ``C`` or a class of one example: then the middle of the grid), then the fit on
    every example. Solved in float64 on CPU / CUDA, over the classes present in ``labels``
    (an absent class: :data:`ABSENT_MARGIN`)."""
    if features.shape[0] != labels.shape[0]:
        raise ValueError(f"{features.shape[0]} feature rows but {labels.shape[0]} labels")
    if features.shape[0] == 0:
        raise ValueError("the probe got no training examples")
    labels = labels.to(features.device).long()
    if int(labels.min()) < 0 or int(labels.max()) >= num_classes:
        raise ValueError(f"labels must be in 0..{num_classes - 1}, got "
                         f"{int(labels.min())}..{int(labels.max())}")
    x = features.detach().to(_solve_dtype(features.device))
    if not bool(torch.isfinite(x).all()):
        raise ValueError("the probe's features contain NaN or inf")
    present = torch.unique(labels)  # an absent class has no optimum (its bias -> -inf):
    index = torch.full((num_classes,), -1, dtype=torch.long, device=labels.device)
    index[present] = torch.arange(len(present), device=labels.device)
    with _cpu_threads(x, num_classes):  # solve over the classes present
        fit = _fit_probe(x, index[labels], len(present), Cs, folds, class_weight, seed,
                         max_iter, tol)
    if len(present) == num_classes:
        return fit
    weight = fit.weight.new_zeros(num_classes, x.shape[1])
    weight[present] = fit.weight
    bias = fit.bias.new_full((num_classes,), float(fit.bias.min()) - ABSENT_MARGIN)
    bias[present] = fit.bias
    return ProbeFit(weight, bias, fit.C, fit.cv_accuracy, fit.iterations)


def _fit_probe(x: Tensor, labels: Tensor, num_classes: int,
               Cs: tuple[float, ...] | list[float] | None, folds: int,
               class_weight: str | None, seed: int, max_iter: int, tol: float) -> ProbeFit:
    grid = sorted(float(c) for c in (Cs if Cs is not None else DEFAULT_CS))
    s = probe_weights(labels, num_classes, class_weight).to(x.dtype)
    smallest = int(torch.bincount(labels).masked_fill(
        torch.bincount(labels) == 0, labels.shape[0]).min())
    k = min(folds, smallest)
    scores: list[float] = []
    losses: list[float] = []
    if len(grid) > 1 and k >= 2:
        held = stratified_folds(labels, k, seed)
        fold_s = torch.zeros(k, labels.shape[0], dtype=x.dtype, device=x.device)
        for f, rows in enumerate(held):  # each fold's training rows, its own class weights
            keep = torch.ones(labels.shape[0], dtype=torch.bool, device=x.device)
            keep[rows.to(x.device)] = False
            fold_s[f, keep] = probe_weights(labels[keep], num_classes, class_weight).to(x.dtype)
        out = fold_s == 0  # (k, N): the held-out rows of each fold
        init = None
        for C in grid:  # warm start from the stronger penalty
            w, b, _ = _lbfgs(x, labels, fold_s, num_classes, C, init, max_iter, tol)
            init = (w, b)
            logits = torch.baddbmm(b[:, None], x.expand(k, -1, -1), w.transpose(1, 2))
            right = ((logits.argmax(-1) == labels) & out).sum(-1).double() / out.sum(-1)
            nll = F.cross_entropy(logits.transpose(1, 2), labels.expand(k, -1),
                                  reduction="none")  # (k, N)
            scores.append(float(right.mean()))
            losses.append(float(((nll * out).sum(-1) / out.sum(-1)).mean()))
        # the best accuracy; among equals the lower held-out cross-entropy (few examples
        # often tie at 100 %, where the smallest C would give near-uniform probabilities)
        best = grid[max(range(len(grid)), key=lambda j: (scores[j], -losses[j]))]
    else:
        best = grid[len(grid) // 2] if len(grid) > 1 else grid[0]
    w, b, iters = fit_logistic(x, labels, num_classes, best, s, None, max_iter, tol)
    return ProbeFit(w, b, best, scores, iters)

