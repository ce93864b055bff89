"""RNN encoder-decoders (no attention, additive, multiplicative) against the transformer
Seq2Seq on number words -> digits, at about the same parameter count and the same budget.

Each model is trained from the same initial seed on the same batches (the training split
of :class:`~multimodal.data.numbers.NumberWordsDataModule`, batch 128) with the seq2seq
task's loss (:meth:`Seq2SeqTask.loss`), AdamW (lr 2e-3, weight decay 0.01), gradient norm
clipped to 1, warm-up over the first 5 % of the budget then cosine to 1 % — the budget is
**CPU time of this process** (one thread), so that load from other processes on a shared
machine does not shorten one model's training more than another's. Then:

- held-out exact match (greedy decoding through :func:`multimodal.generation.generate`)
  on the test numbers, overall and by source length in words (a figure);
- training throughput, tokens (source + target, padding excluded) per second of a
  training step, measured round-robin before training: every model is timed once per
  round on the same batches, so background load hits all alike; the median and the
  min-max spread over rounds are printed;
- the additive model's attention weights for one long test number (a figure).

The RNN hidden sizes are picked so that each model's parameter count is the closest to
the transformer's (configs/seq2seq_numbers.yaml, 239 616 parameters).

Run: ``OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/rnn_vs_transformer.py``
(``--budget`` CPU seconds per model, default 120; ``--cell lstm`` for LSTMs).
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from multimodal.data.numbers import (
    NumberWordsDataModule,
    collate_pairs,
    number_to_words,
    source_tokenizer,
    target_tokenizer,
)
from multimodal.models.rnn import RNNSeq2Seq, RNNSeq2SeqConfig
from multimodal.models.seq2seq import Seq2Seq, Seq2SeqConfig
from multimodal.plots import _pyplot, save_figure
from multimodal.tasks.seq2seq import Seq2SeqTask, exact_match
from multimodal.tokenizers.text import PAD_ID

VOCAB = {"source_vocab_size": 39, "target_vocab_size": 17, "max_source_len": 24,
         "max_target_len": 12}
BUCKETS = ((1, 3), (4, 6), (7, 9), (10, 12), (13, 24))


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def transformer() -> Seq2Seq:
    return Seq2Seq(Seq2SeqConfig(**VOCAB, dim=64, encoder_depth=2, decoder_depth=2, heads=4,
                                 mlp_dim=256))


def rnn_matching(target: int, attention: str, cell: str) -> RNNSeq2Seq:
    """The RNN (embed 64) whose hidden size gives the parameter count closest to ``target``."""
    def build(hidden: int) -> RNNSeq2Seq:
        return RNNSeq2Seq(RNNSeq2SeqConfig(**VOCAB, embed_dim=64, hidden_dim=hidden,
                                           cell=cell, attention=attention))
    best = min(range(32, 400, 4), key=lambda h: abs(n_params(build(h)) - target))
    return build(best)


def tokens_in(batch: dict[str, Tensor]) -> int:
    return int(batch["source_mask"].sum()) + int((batch["target_ids"] != PAD_ID).sum())


def train_step(task: Seq2SeqTask, opt: torch.optim.Optimizer, batch: dict[str, Tensor]) -> float:
    loss = task.loss(batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(task.model.parameters(), 1.0)
    opt.step()
    return float(loss.detach())


def throughput(models: dict[str, nn.Module], batches: list[dict[str, Tensor]], rounds: int,
               steps: int) -> dict[str, list[float]]:
    """Tokens per wall-clock second of training steps, every model timed once per round."""
    rates: dict[str, list[float]] = {name: [] for name in models}
    tasks = {name: Seq2SeqTask(copy.deepcopy(m)) for name, m in models.items()}
    opts = {name: torch.optim.AdamW(t.model.parameters(), lr=1e-3) for name, t in tasks.items()}
    for name in tasks:  # warm-up
        train_step(tasks[name], opts[name], batches[0])
    for _ in range(rounds):
        for name, task in tasks.items():
            start, tokens = time.perf_counter(), 0
            for i in range(steps):
                batch = batches[i % len(batches)]
                train_step(task, opts[name], batch)
                tokens += tokens_in(batch)
            rates[name].append(tokens / (time.perf_counter() - start))
    return rates


def lr_at(fraction: float, base: float, warmup: float = 0.05, floor: float = 0.01) -> float:
    if fraction < warmup:
        return base * fraction / warmup
    progress = min(1.0, (fraction - warmup) / (1 - warmup))
    return base * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def train(model: nn.Module, loader: Callable[[], DataLoader], budget: float, lr: float
          ) -> dict[str, float]:
    """Train for ``budget`` CPU seconds of this process; returns steps, last loss, wall time."""
    task = Seq2SeqTask(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model.train()
    cpu0, wall0, steps, loss = time.process_time(), time.perf_counter(), 0, 0.0
    while True:
        for batch in loader():
            used = time.process_time() - cpu0
            if used >= budget:
                return {"steps": steps, "loss": loss,
                        "wall_s": time.perf_counter() - wall0}
            for group in opt.param_groups:
                group["lr"] = lr_at(used / budget, lr)
            loss = train_step(task, opt, batch)
            steps += 1


@torch.no_grad()
def evaluate(model: nn.Module, pairs: list[tuple[list[int], list[int]]]
             ) -> tuple[float, dict[tuple[int, int], tuple[float, int]]]:
    """Exact match over ``pairs`` and per source-length bucket (rate, count)."""
    model.eval()
    hits, lengths = [], []
    for i in range(0, len(pairs), 256):
        chunk = pairs[i : i + 256]
        batch = collate_pairs(chunk)
        out = model.generate(batch["source_ids"], batch["source_mask"],
                             max_new_tokens=VOCAB["max_target_len"] - 1)
        hits += exact_match(out, batch["target_ids"]).tolist()
        lengths += [len(s) for s, _ in chunk]
    by_bucket = {}
    for lo, hi in BUCKETS:
        sel = [h for h, n in zip(hits, lengths, strict=True) if lo <= n <= hi]
        by_bucket[(lo, hi)] = (sum(sel) / max(len(sel), 1), len(sel))
    return sum(hits) / len(hits), by_bucket


def plot_buckets(results: dict[str, dict[tuple[int, int], tuple[float, int]]], path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    labels = [f"{lo}-{hi}" if hi < 24 else f"{lo}+" for lo, hi in BUCKETS]
    for name, buckets in results.items():
        ax.plot(labels, [100 * buckets[b][0] for b in BUCKETS], marker="o", label=name)
    counts = next(iter(results.values()))
    ax.set_xticks(range(len(BUCKETS)),
                  [f"{lab}\n(n={counts[b][1]})" for lab, b in zip(labels, BUCKETS, strict=True)])
    ax.set_xlabel("source length (words)")
    ax.set_ylabel("held-out exact match (%)")
    ax.set_title("Number words -> digits, same parameters and CPU budget")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)


@torch.no_grad()
def plot_alignment(model: RNNSeq2Seq, number: int, path: Path) -> str:
    """Heatmap of the additive model's attention (output digits x input words) while it
    decodes ``number`` greedily; returns what it decoded."""
    src_tok, tgt_tok = source_tokenizer(), target_tokenizer()
    src = torch.tensor([src_tok.encode(number_to_words(number))])
    out = model.generate(src)
    _, weights = model(src, out, return_attention=True)
    digits = tgt_tok.decode(out[0, 1:].tolist())
    steps = len(digits) + 1  # the digits and [EOS]
    plt = _pyplot()
    words = [src_tok.decode([i]) for i in src[0].tolist()]
    fig, ax = plt.subplots(figsize=(0.55 * len(words) + 1.5, 0.4 * steps + 1.5), dpi=120)
    ax.imshow(weights[0, :steps].numpy(), cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(words)), words, rotation=60, ha="right")
    ax.set_yticks(range(steps), [*digits, "[EOS]"])
    ax.set_xlabel("input words")
    ax.set_ylabel("output digits")
    ax.set_title(f"additive attention, {number}")
    save_figure(fig, path)
    return digits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=120.0, help="CPU seconds per model")
    parser.add_argument("--cell", choices=("gru", "lstm"), default="gru")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--rounds", type=int, default=5, help="throughput rounds")
    parser.add_argument("--steps", type=int, default=10, help="training steps per round")
    parser.add_argument("--figures", default="docs/figures")
    args = parser.parse_args()
    torch.set_num_threads(1)

    dm = NumberWordsDataModule(train_size=50_000, held_out=10_000, val_size=500,
                               test_size=2000, batch_size=128)
    train_set, test_set = dm.split_dataset("train"), dm.split_dataset("test")

    def loader() -> DataLoader:
        return DataLoader(train_set, batch_size=128, shuffle=True, collate_fn=collate_pairs,
                          generator=torch.Generator().manual_seed(0))

    torch.manual_seed(0)
    ref = transformer()
    models: dict[str, nn.Module] = {}
    cell = args.cell.upper()
    for name, attention in ((cell, "none"), (f"{cell} + additive", "additive"),
                            (f"{cell} + multiplicative", "multiplicative")):
        torch.manual_seed(0)
        models[name] = rnn_matching(n_params(ref), attention, args.cell)
    models["transformer"] = ref

    batches = [b for b, _ in zip(loader(), range(4), strict=False)]
    rates = throughput(models, batches, args.rounds, args.steps)

    pairs = [test_set[i] for i in range(len(test_set))]
    rows, buckets = [], {}
    for name, model in models.items():
        stats = train(model, loader, args.budget, args.lr)
        em, by_bucket = evaluate(model, pairs)
        buckets[name] = by_bucket
        hidden = getattr(model.config, "hidden_dim", None)
        rows.append((name, n_params(model), hidden, stats, em, rates[name]))
        print(f"{name}: {stats['steps']} steps, loss {stats['loss']:.4f}, "
              f"exact match {100 * em:.2f} %", flush=True)

    figures = Path(args.figures)
    plot_buckets(buckets, figures / f"rnn_vs_transformer_length_{args.cell}.png")
    additive = models[f"{cell} + additive"]
    assert isinstance(additive, RNNSeq2Seq)
    digits = plot_alignment(additive, 345_678,
                            figures / f"rnn_additive_alignment_{args.cell}.png")

    base = statistics.median(rates["transformer"])
    print(f"\nbudget {args.budget:.0f} CPU s per model, one thread; throughput: median "
          f"(min-max) of {args.rounds} rounds x {args.steps} steps, batch 128\n")
    print("| model | parameters | hidden | steps in budget | wall s | exact match % | "
          "tokens/s | vs transformer |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, params, hidden, stats, em, r in rows:
        med = statistics.median(r)
        print(f"| {name} | {params:,} | {hidden or 64} | {stats['steps']} | "
              f"{stats['wall_s']:.0f} | {100 * em:.2f} | {med:,.0f} ({min(r):,.0f}-"
              f"{max(r):,.0f}) | {med / base:.2f}x |")
    print("\nexact match % by source length (words):\n")
    print("| model | " + " | ".join(f"{lo}-{hi}" for lo, hi in BUCKETS) + " |")
    print("| --- |" + " ---: |" * len(BUCKETS))
    for name, by_bucket in buckets.items():
        print(f"| {name} | " + " | ".join(f"{100 * by_bucket[b][0]:.1f}" for b in BUCKETS)
              + " |")
    print("| (test numbers) | " + " | ".join(str(buckets[name][b][1]) for b in BUCKETS)
          + " |")
    print(f"\nalignment figure: 345678 decoded as {digits!r}")


if __name__ == "__main__":
    main()
