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

``--numbers-per-source K`` (K > 1) makes every example a list of 1..K numbers
(``"twelve , five" -> "12,5"``, sources up to ~14 K words): the test then spans short and
long inputs, and exact match by source length shows whether a model's accuracy falls
with length (the bottleneck of the encoder-decoder without attention). ``--seeds`` repeats
every model with other initial weights and batch orders (the data stay the same); each
run appends one JSON line to ``--results``, and ``--report FILE...`` prints the tables
(median and min-max over seeds) and draws the figure from those lines, so runs split
over several processes are summarised together.

The RNN hidden sizes are picked so that each model's parameter count is the closest to
the transformer's (configs/seq2seq_numbers.yaml, 239 616 parameters).

Run: ``OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/rnn_vs_transformer.py``
(``--budget`` CPU seconds per model, default 120; ``--models`` picks from
``gru[+additive|+multiplicative]``, ``lstm[...]`` and ``transformer``).
"""

from __future__ import annotations

import argparse
import copy
import json
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
    numbers_to_words,
    source_tokenizer,
    target_tokenizer,
)
from multimodal.models.rnn import RNNSeq2Seq, RNNSeq2SeqConfig
from multimodal.models.seq2seq import Seq2Seq, Seq2SeqConfig
from multimodal.plots import _pyplot, save_figure
from multimodal.tasks.seq2seq import Seq2SeqTask, exact_match
from multimodal.tokenizers.text import PAD_ID

MODELS = ("gru", "gru+additive", "gru+multiplicative", "lstm", "lstm+additive",
          "lstm+multiplicative", "transformer")
LABELS = {"gru": "GRU", "lstm": "LSTM", "additive": "additive", "multiplicative":
          "multiplicative", "transformer": "transformer"}


def label(name: str) -> str:
    return " + ".join(LABELS[part] for part in name.split("+"))


def sizes(numbers_per_source: int) -> dict[str, int]:
    """Vocabularies and length limits: 24 source words and 12 target ids per number, as
    configs/seq2seq_numbers.yaml (a list of K numbers: 24 K words, 7 K + 1 ids)."""
    k = numbers_per_source
    dm = NumberWordsDataModule(numbers_per_source=k)
    return {"source_vocab_size": dm.source_vocab_size,
            "target_vocab_size": dm.target_vocab_size, "max_source_len": 24 * k,
            "max_target_len": 12 if k == 1 else 7 * k + 1}


def buckets_for(numbers_per_source: int) -> tuple[tuple[int, int], ...]:
    """Source-length buckets (words): the seq2seq task's for one number, tens for lists."""
    if numbers_per_source == 1:
        return ((1, 3), (4, 6), (7, 9), (10, 12), (13, 24))
    return tuple((lo, lo + 9) for lo in range(1, 24 * numbers_per_source, 10))


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def transformer(vocab: dict[str, int]) -> Seq2Seq:
    return Seq2Seq(Seq2SeqConfig(**vocab, dim=64, encoder_depth=2, decoder_depth=2, heads=4,
                                 mlp_dim=256))


def rnn_matching(target: int, attention: str, cell: str, vocab: dict[str, int]) -> RNNSeq2Seq:
    """The RNN (embed 64) whose hidden size gives the parameter count closest to ``target``."""
    def build(hidden: int) -> RNNSeq2Seq:
        return RNNSeq2Seq(RNNSeq2SeqConfig(**vocab, embed_dim=64, hidden_dim=hidden,
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
def evaluate(model: nn.Module, pairs: list[tuple[list[int], list[int]]],
             buckets: tuple[tuple[int, int], ...], max_target_len: int
             ) -> tuple[float, list[tuple[int, int, float, int]]]:
    """Exact match over ``pairs`` and per source-length bucket ``(lo, hi, rate, count)``."""
    model.eval()
    hits, lengths = [], []
    for i in range(0, len(pairs), 256):
        chunk = pairs[i : i + 256]
        batch = collate_pairs(chunk)
        out = model.generate(batch["source_ids"], batch["source_mask"],
                             max_new_tokens=max_target_len - 1)
        hits += exact_match(out, batch["target_ids"]).tolist()
        lengths += [len(s) for s, _ in chunk]
    by_bucket = []
    for lo, hi in buckets:
        sel = [h for h, n in zip(hits, lengths, strict=True) if lo <= n <= hi]
        by_bucket.append((lo, hi, sum(sel) / max(len(sel), 1), len(sel)))
    return sum(hits) / len(hits), by_bucket


def spread(values: list[float], scale: float = 1.0, fmt: str = ".1f") -> str:
    """``median (min-max)`` of ``values`` (just the value for one)."""
    v = [scale * x for x in values]
    med = statistics.median(v)
    if len(v) == 1:
        return f"{med:{fmt}}"
    return f"{med:{fmt}} ({min(v):{fmt}}-{max(v):{fmt}})"


def plot_buckets(runs: dict[str, list[dict]], path: Path, title: str) -> None:
    """Exact match by source-length bucket, one curve per model: the median over seeds,
    with the min-max band."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    first = next(iter(runs.values()))[0]["buckets"]
    keep = [i for i, b in enumerate(first) if b[3] > 0]
    xs = list(range(len(keep)))
    for name, model_runs in runs.items():
        rates = [[100 * r["buckets"][i][2] for r in model_runs] for i in keep]
        n = len(model_runs)
        (line,) = ax.plot(xs, [statistics.median(r) for r in rates], marker="o",
                          label=f"{label(name)} ({n} seed{'s' if n > 1 else ''})")
        if n > 1:
            ax.fill_between(xs, [min(r) for r in rates], [max(r) for r in rates], alpha=0.15,
                            color=line.get_color())
    ax.set_xticks(xs, [f"{first[i][0]}-{first[i][1]}\n(n={first[i][3]})" for i in keep])
    ax.set_xlabel("source length (words)")
    ax.set_ylabel("held-out exact match (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def report(paths: list[str], figures: Path) -> None:
    """Tables (median and min-max over seeds) and the length figure from result lines."""
    lines = [json.loads(line) for p in paths for line in Path(p).read_text().splitlines()
             if line.strip()]
    by_task: dict[int, dict[str, list[dict]]] = {}
    for r in lines:
        by_task.setdefault(r["numbers_per_source"], {}).setdefault(r["model"], []).append(r)
    for k, runs in sorted(by_task.items()):
        runs = {m: runs[m] for m in MODELS if m in runs}
        budgets = sorted({r["budget"] for rs in runs.values() for r in rs})
        print(f"\n## {k} number(s) per source; budget {budgets} CPU s per model and seed\n")
        print("| model | parameters | hidden | seeds | steps in budget | exact match %, median "
              "(min-max) | train tokens/s, median (min-max) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name, rs in runs.items():
            rates = [x for r in rs for x in r.get("tokens_per_s", [])]
            print(f"| {label(name)} | {rs[0]['params']:,} | {rs[0]['hidden'] or 64} | "
                  f"{','.join(str(r['seed']) for r in rs)} | "
                  f"{spread([r['steps'] for r in rs], fmt='.0f')} | "
                  f"{spread([r['exact_match'] for r in rs], 100, '.2f')} | "
                  f"{spread(rates, fmt=',.0f') if rates else '-'} |")
        first = next(iter(runs.values()))[0]["buckets"]
        keep = [i for i, b in enumerate(first) if b[3] > 0]
        print("\nexact match % by source length (words), median (min-max) over seeds:\n")
        print("| model | " + " | ".join(f"{first[i][0]}-{first[i][1]}" for i in keep) + " |")
        print("| --- |" + " ---: |" * len(keep))
        for name, rs in runs.items():
            print(f"| {label(name)} | " + " | ".join(
                spread([r["buckets"][i][2] for r in rs], 100) for i in keep) + " |")
        print("| (test examples) | " + " | ".join(str(first[i][3]) for i in keep) + " |")
        tag = "gru" if k == 1 else f"lists{k}"
        title = ("Number words -> digits, same parameters and CPU budget" if k == 1 else
                 f"Lists of 1-{k} numbers, words -> digits, same parameters and CPU budget")
        plot_buckets(runs, figures / f"rnn_vs_transformer_length_{tag}.png", title)


@torch.no_grad()
def plot_alignment(model: RNNSeq2Seq, numbers: tuple[int, ...], path: Path) -> str:
    """Heatmap of the additive model's attention (output digits x input words) while it
    decodes ``numbers`` greedily; returns what it decoded."""
    lists = len(numbers) > 1
    src_tok, tgt_tok = source_tokenizer(separator=lists), target_tokenizer(separator=lists)
    src = torch.tensor([src_tok.encode(numbers_to_words(numbers))])
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
    ax.set_title(f"additive attention, {','.join(map(str, numbers))}")
    save_figure(fig, path)
    return digits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=120.0, help="CPU seconds per model")
    parser.add_argument("--models", nargs="+", choices=MODELS,
                        default=["gru", "gru+additive", "gru+multiplicative", "transformer"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--numbers-per-source", type=int, default=1,
                        help="K > 1: lists of 1..K numbers per example")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--rounds", type=int, default=5, help="throughput rounds (0: none)")
    parser.add_argument("--steps", type=int, default=10, help="training steps per round")
    parser.add_argument("--figures", default="docs/figures")
    parser.add_argument("--results", default="runs/rnn_vs_transformer.jsonl",
                        help="one JSON line per (model, seed) is appended here")
    parser.add_argument("--report", nargs="+", metavar="FILE",
                        help="only print the tables and draw the figure from result files")
    args = parser.parse_args()
    figures = Path(args.figures)
    if args.report:
        report(args.report, figures)
        return
    torch.set_num_threads(1)

    k = args.numbers_per_source
    vocab, buckets = sizes(k), buckets_for(k)
    dm = NumberWordsDataModule(train_size=50_000, held_out=10_000, val_size=500,
                               test_size=2000, batch_size=128, numbers_per_source=k)
    train_set, test_set = dm.split_dataset("train"), dm.split_dataset("test")
    pairs = [test_set[i] for i in range(len(test_set))]
    results = Path(args.results)
    results.parent.mkdir(parents=True, exist_ok=True)

    def build(name: str, seed: int) -> nn.Module:
        torch.manual_seed(0)
        target = n_params(transformer(vocab))
        torch.manual_seed(seed)
        if name == "transformer":
            return transformer(vocab)
        cell, _, attention = name.partition("+")
        return rnn_matching(target, attention or "none", cell, vocab)

    rates: dict[str, list[float]] = {}
    if args.rounds:
        def first_loader() -> DataLoader:
            return DataLoader(train_set, batch_size=128, shuffle=True, collate_fn=collate_pairs,
                              generator=torch.Generator().manual_seed(0))
        batches = [b for b, _ in zip(first_loader(), range(4), strict=False)]
        rates = throughput({m: build(m, 0) for m in args.models}, batches, args.rounds,
                           args.steps)

    for seed in args.seeds:
        def loader(seed: int = seed) -> DataLoader:
            return DataLoader(train_set, batch_size=128, shuffle=True, collate_fn=collate_pairs,
                              generator=torch.Generator().manual_seed(seed))

        for name in args.models:
            model = build(name, seed)
            stats = train(model, loader, args.budget, args.lr)
            em, by_bucket = evaluate(model, pairs, buckets, vocab["max_target_len"])
            row = {"model": name, "seed": seed, "numbers_per_source": k, "budget": args.budget,
                   "params": n_params(model), "hidden": getattr(model.config, "hidden_dim", None),
                   **stats, "exact_match": em, "buckets": by_bucket,
                   "tokens_per_s": rates.get(name, []) if seed == args.seeds[0] else []}
            with results.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"seed {seed} {label(name)}: {stats['steps']} steps, loss {stats['loss']:.4f}, "
                  f"exact match {100 * em:.2f} % ("
                  + ", ".join(f"{lo}-{hi}: {100 * r:.0f}" for lo, hi, r, n in by_bucket if n)
                  + ")", flush=True)
            if name == "gru+additive" and seed == args.seeds[0]:
                assert isinstance(model, RNNSeq2Seq)
                example = (345_678,) if k == 1 else (345_678, 12, 9005, 770_001)[:k]
                tag = "gru" if k == 1 else f"gru_lists{k}"
                digits = plot_alignment(model, example,
                                        figures / f"rnn_additive_alignment_{tag}.png")
                print(f"alignment figure: {example} decoded as {digits!r}", flush=True)
    report([str(results)], figures)


if __name__ == "__main__":
    main()
