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

The transformer's side: ``--models transformer:pos=rope,norm=post,dim=96,depth=1``
trains a variant of the transformer (positions learned / sinusoidal / rotary, encoder
post-norm, width, depth, heads, MLP ratio); ``--lr`` / ``--warmup`` set the recipe, and
``NAME@lr=3e-3,warmup=1`` one model's own; ``--converge`` trains until validation exact
match stops improving (best checkpoint restored) and records the CPU seconds to 90 %, and
``--grid LR:WARMUP ...`` first tries every point on the first seed for ``--search-budget``
CPU s and converges each model with its best point (by validation exact match);
``--train-numbers M`` trains on lists of 1..M numbers and tests on 1..K
(length generalisation); ``--length-throughput`` measures training tokens per CPU second
against source length; ``--cross-attention`` draws each trained transformer's
cross-attention on a 4-number list.

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
from multimodal.models.text import TextDecoderConfig, TextEncoderConfig
from multimodal.plots.figures import pyplot, save_figure
from multimodal.tasks.seq2seq import Seq2SeqTask, exact_match
from multimodal.tokenizers.text import PAD_ID

MODELS = ("gru", "gru+additive", "gru+multiplicative", "lstm", "lstm+additive",
          "lstm+multiplicative", "transformer")
LABELS = {"gru": "GRU", "lstm": "LSTM", "additive": "additive", "multiplicative":
          "multiplicative", "transformer": "transformer"}


TRANSFORMER_DEFAULTS = {"dim": 64, "depth": 2, "heads": 4, "mlp": 4, "pos": "learned",
                        "norm": "pre"}


def parse_variant(name: str) -> tuple[str, dict[str, str]]:
    """``"transformer:pos=rope,dim=96,depth=1"`` -> ``("transformer", {...})``: a base model
    of :data:`MODELS` and, for the transformer only, overrides of
    :data:`TRANSFORMER_DEFAULTS` (``pos`` learned / sinusoidal / rope, ``norm`` pre / post,
    ``dim``, ``depth`` (encoder and decoder each), ``heads``, ``mlp`` (ratio)).
    ``norm=post`` reaches the encoder only: the package's TextDecoder is fixed pre-norm."""
    base, _, spec = name.partition(":")
    if base not in MODELS:
        raise argparse.ArgumentTypeError(f"unknown model {base!r}; pick from {MODELS}")
    opts: dict[str, str] = {}
    for item in filter(None, spec.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in TRANSFORMER_DEFAULTS or base != "transformer":
            raise argparse.ArgumentTypeError(
                f"bad variant {item!r} in {name!r}: only the transformer takes KEY=VALUE "
                f"overrides, KEY in {sorted(TRANSFORMER_DEFAULTS)}")
        opts[key] = value
    if opts.get("pos", "learned") not in ("learned", "sinusoidal", "rope"):
        raise argparse.ArgumentTypeError(f"pos must be learned, sinusoidal or rope in {name!r}")
    if opts.get("norm", "pre") not in ("pre", "post"):
        raise argparse.ArgumentTypeError(f"norm must be pre or post in {name!r}")
    return base, opts


def parse_recipe(spec: str) -> tuple[str, dict[str, float]]:
    """``"gru+multiplicative@lr=3e-3,warmup=1"`` -> ``("gru+multiplicative", {"lr": 0.003,
    "warmup": 1.0})``: a model (see :func:`parse_variant`) and its own learning rate and
    warm-up, which override ``--lr`` / ``--warmup`` for that model only."""
    name, _, recipe = spec.partition("@")
    parse_variant(name)
    out: dict[str, float] = {}
    for item in filter(None, recipe.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in ("lr", "warmup"):
            raise argparse.ArgumentTypeError(
                f"bad recipe {item!r} in {spec!r}: only lr=VALUE and warmup=VALUE")
        try:
            out[key] = float(value)
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"{key} must be a number in {spec!r}") from err
    return name, out


def model_name(spec: str) -> str:
    """Validates ``spec`` (argparse type: a model, optionally ``@lr=..,warmup=..``) and
    returns it unchanged."""
    parse_recipe(spec)
    return spec


def grid_point(text: str) -> tuple[float, float]:
    """``"3e-3:1"`` -> ``(0.003, 1.0)``: a (learning rate, warm-up) point of ``--grid``."""
    lr, sep, warmup = text.partition(":")
    try:
        return float(lr), float(warmup) if sep else 0.05
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"grid point {text!r} is not LR:WARMUP") from err


def label(name: str) -> str:
    base, opts = parse_variant(name)
    text = " + ".join(LABELS[part] for part in base.split("+"))
    return f"{text} ({', '.join(f'{k}={v}' for k, v in opts.items())})" if opts else text


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


def transformer(vocab: dict[str, int], opts: dict[str, str] | None = None) -> Seq2Seq:
    """The Seq2Seq of configs/seq2seq_numbers.yaml (dim 64, 2 + 2 layers, 4 heads, MLP 256,
    learned positions, pre-norm), or a variant (see :func:`parse_variant`)."""
    o = {**TRANSFORMER_DEFAULTS, **(opts or {})}
    dim, depth, rope = int(o["dim"]), int(o["depth"]), o["pos"] == "rope"
    pos = "none" if rope else o["pos"]
    side = {"pos_embed": pos, "norm": o["norm"], "rope": "1d" if rope else "none"}
    enc = TextEncoderConfig(vocab_size=vocab["source_vocab_size"],
                            max_len=vocab["max_source_len"], mlm_head=False, **side)
    dec = TextDecoderConfig(vocab_size=vocab["target_vocab_size"],
                            max_len=vocab["max_target_len"], **side)
    return Seq2Seq(Seq2SeqConfig(encoder=enc, decoder=dec, dim=dim, encoder_depth=depth,
                                 decoder_depth=depth, heads=int(o["heads"]),
                                 mlp_dim=int(float(o["mlp"]) * dim)))


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


def length_throughput(names: list[str], lengths: list[int], batch_size: int, target_len: int,
                      rounds: int, steps: int, vocab: dict[str, int],
                      build: Callable[[str, dict[str, int]], nn.Module]) -> list[dict]:
    """Training tokens per **CPU second** (this process, one thread) against source length.

    Synthetic batches: ``batch_size`` random sources of exactly ``L`` words and targets of
    ``target_len`` ids, so the source length is the only thing that changes. Every model is
    timed once per round at every length (round-robin, so background load hits all alike);
    CPU time of a single-threaded process is little affected by other processes. Returns one
    dict per (model, length): ``tokens_per_cpu_s`` (per round) and ``params``.
    """
    gen = torch.Generator().manual_seed(0)
    batches = {}
    for length in lengths:
        src = torch.randint(4, vocab["source_vocab_size"], (batch_size, length), generator=gen)
        tgt = torch.randint(4, vocab["target_vocab_size"], (batch_size, target_len),
                            generator=gen)
        tgt[:, 0] = 1  # [BOS]
        batches[length] = {"source_ids": src, "source_mask": torch.ones_like(src),
                           "target_ids": tgt}
    models = {name: build(name, vocab) for name in names}
    tasks = {name: Seq2SeqTask(m) for name, m in models.items()}
    opts = {name: torch.optim.AdamW(t.model.parameters(), lr=1e-4) for name, t in tasks.items()}
    rates: dict[tuple[str, int], list[float]] = {(n, x): [] for n in names for x in lengths}
    for name in names:  # warm-up (allocator, first-call costs)
        train_step(tasks[name], opts[name], batches[lengths[0]])
    for _ in range(rounds):
        for length in lengths:
            for name, task in tasks.items():
                cpu0 = time.process_time()
                for _ in range(steps):
                    train_step(task, opts[name], batches[length])
                tokens = steps * batch_size * (length + target_len)
                rates[(name, length)].append(tokens / (time.process_time() - cpu0))
    return [{"model": n, "source_len": x, "params": n_params(models[n]),
             "tokens_per_cpu_s": r, "batch_size": batch_size, "target_len": target_len}
            for (n, x), r in rates.items()]


def plot_length_throughput(rows: list[dict], path: Path) -> None:
    """Tokens per CPU second against source length, median over rounds with min-max bars."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for name in dict.fromkeys(r["model"] for r in rows):
        rs = sorted((r for r in rows if r["model"] == name), key=lambda r: r["source_len"])
        xs = [r["source_len"] for r in rs]
        med = [statistics.median(r["tokens_per_cpu_s"]) for r in rs]
        lo = [m - min(r["tokens_per_cpu_s"]) for m, r in zip(med, rs, strict=True)]
        hi = [max(r["tokens_per_cpu_s"]) - m for m, r in zip(med, rs, strict=True)]
        ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=2,
                    label=f"{label(name)} ({rs[0]['params'] / 1e3:.0f} K)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("source length (tokens)")
    ax.set_ylabel("training tokens per CPU second")
    first = rows[0]
    ax.set_title(f"One CPU thread, batch {first['batch_size']}, target {first['target_len']} "
                 "tokens", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def lr_at(fraction: float, base: float, warmup: float = 0.05, floor: float = 0.01) -> float:
    if fraction < warmup:
        return base * fraction / warmup
    progress = min(1.0, (fraction - warmup) / (1 - warmup))
    return base * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def train(model: nn.Module, loader: Callable[[], DataLoader], budget: float, lr: float,
          warmup: float = 0.05) -> dict[str, float]:
    """Train for ``budget`` CPU seconds of this process (warm-up over the first ``warmup``
    of it, then cosine); returns steps, last loss, wall time."""
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
                group["lr"] = lr_at(used / budget, lr, warmup)
            loss = train_step(task, opt, batch)
            steps += 1


def train_converge(model: nn.Module, loader: Callable[[], DataLoader], max_budget: float,
                   lr: float, warmup: float, check: Callable[[], float], every: float,
                   patience: int, target: float = 0.9) -> dict:
    """Train until validation exact match stops improving (early stopping).

    Warm-up over the first ``warmup * every`` CPU seconds, then a constant learning rate;
    every ``every`` CPU seconds of *training* (evaluation is not counted) ``check()`` gives
    the validation exact match; training stops after ``patience`` checks without a new best,
    at 100 %, or after ``max_budget`` CPU seconds, and the best checkpoint is restored.
    Returns steps, the curve ``[(cpu_s, steps, val)]``, the best validation exact match,
    ``cpu_to_90``: training CPU seconds at the first check with val >= ``target`` (None if
    never), and ``stopped``: why training ended (``"patience"``, ``"100 %"`` or ``"cap"``,
    the last meaning *not* converged).
    """
    task = Seq2SeqTask(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    wall0, steps, loss, used, next_check = time.perf_counter(), 0, 0.0, 0.0, every
    best, best_state, since, curve, hit = -1.0, None, 0, [], None
    while True:
        for batch in loader():
            model.train()
            cpu0 = time.process_time()
            for group in opt.param_groups:
                group["lr"] = lr * min(1.0, used / max(warmup * every, 1e-9))
            loss = train_step(task, opt, batch)
            steps += 1
            used += time.process_time() - cpu0
            if used < next_check and used < max_budget:
                continue
            next_check += every
            val = check()
            curve.append((round(used, 1), steps, val))
            print(f"  {used:.0f} CPU s, {steps} steps, loss {loss:.4f}, val {100 * val:.1f} %",
                  flush=True)
            if hit is None and val >= target:
                hit = used
            if val > best:
                best, best_state, since = val, copy.deepcopy(model.state_dict()), 0
            else:
                since += 1
            if since >= patience or best >= 1.0 or used >= max_budget:
                model.load_state_dict(best_state)
                stopped = "100 %" if best >= 1.0 else "patience" if since >= patience else "cap"
                return {"steps": steps, "loss": loss, "train_cpu_s": used,
                        "wall_s": time.perf_counter() - wall0, "curve": curve,
                        "best_val": best, "cpu_to_90": hit, "stopped": stopped}


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
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6 + 0.15 * len(runs)), dpi=110)
    first = next(iter(runs.values()))[0]["buckets"]
    keep = [i for i, b in enumerate(first) if b[3] > 0]
    xs = list(range(len(keep)))
    for name, model_runs in runs.items():
        rates = [[100 * r["buckets"][i][2] for r in model_runs] for i in keep]
        n = len(model_runs)
        (line,) = ax.plot(xs, [statistics.median(r) for r in rates], marker="o",
                          label=f"{key_label(name)} ({n} seed{'s' if n > 1 else ''})")
        if n > 1:
            ax.fill_between(xs, [min(r) for r in rates], [max(r) for r in rates], alpha=0.15,
                            color=line.get_color())
    ax.set_xticks(xs, [f"{first[i][0]}-{first[i][1]}\n(n={first[i][3]})" for i in keep])
    ax.set_xlabel("source length (words)")
    ax.set_ylabel("held-out exact match (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    save_figure(fig, path)


def run_key(r: dict) -> str:
    """A result line's model, with its recipe when it is not the default one."""
    lr, warmup = r.get("lr", 2e-3), r.get("warmup", 0.05)
    return r["model"] if (lr, warmup) == (2e-3, 0.05) else \
        f"{r['model']} @lr={lr:g},warmup={warmup:g}"


def key_label(key: str) -> str:
    name, _, recipe = key.partition(" @")
    return f"{label(name)} [{recipe.replace(',', ', ')}]" if recipe else label(name)


def task_of(r: dict) -> tuple[str, str]:
    """(figure tag, title) of a result line's experiment."""
    k, mode = r["numbers_per_source"], r.get("mode", "budget")
    if mode == "extrapolate":
        return (f"extrapolate{r['train_numbers']}to{k}",
                f"Trained on lists of 1-{r['train_numbers']} numbers, tested on 1-{k}")
    if mode == "converge":
        return (f"lists{k}_converged", f"Lists of 1-{k} numbers, early stopping on validation "
                "exact match")
    if mode == "search":
        return (f"lists{k}_search", f"Lists of 1-{k} numbers, recipe search (seed "
                f"{r['seed']}, validation exact match decides)")
    if k == 1:
        return "gru", "Number words -> digits, same parameters and CPU budget"
    return f"lists{k}", f"Lists of 1-{k} numbers, words -> digits, same parameters and CPU budget"


def report(paths: list[str], figures: Path, plot: bool = True) -> None:
    """Tables (median and min-max over seeds) and the length figures from result lines."""
    lines = [json.loads(line) for p in paths for line in Path(p).read_text().splitlines()
             if line.strip()]
    by_task: dict[tuple[str, str], dict[str, list[dict]]] = {}
    for r in lines:
        by_task.setdefault(task_of(r), {}).setdefault(run_key(r), []).append(r)
    for (tag, title), runs in by_task.items():
        runs = dict(sorted(runs.items(), key=lambda kv: (
            MODELS.index(parse_variant(kv[0].partition(" @")[0])[0]), kv[0])))
        converge = tag.endswith(("converged", "search"))
        budgets = sorted({r["budget"] for rs in runs.values() for r in rs})
        print(f"\n## {title}; budget {budgets} CPU s per model and seed\n")
        extra = (" | training CPU s | stopped by | CPU s to 90 % val | best val % |"
                 if converge else " |")
        print("| model | parameters | width | seeds | steps | exact match %, median "
              "(min-max) | train tokens/s, median (min-max)" + extra)
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---:" + (
            " | ---: | --- | ---: | ---: |" if converge else " |"))
        for key, rs in runs.items():
            rates = [x for r in rs for x in r.get("tokens_per_s", [])]
            row = (f"| {key_label(key)} | {rs[0]['params']:,} | {rs[0]['hidden'] or 64} | "
                   f"{','.join(str(r['seed']) for r in rs)} | "
                   f"{spread([r['steps'] for r in rs], fmt='.0f')} | "
                   f"{spread([r['exact_match'] for r in rs], 100, '.2f')} | "
                   f"{spread(rates, fmt=',.0f') if rates else '-'} |")
            if converge:
                hit = [r["cpu_to_90"] for r in rs if r.get("cpu_to_90") is not None]
                stops = [r.get("stopped", "?") for r in rs]
                row += (f" {spread([r['train_cpu_s'] for r in rs], fmt='.0f')} | "
                        + ", ".join(f"{w} {stops.count(w)}/{len(rs)}"
                                    for w in dict.fromkeys(stops))
                        + f" | {spread(hit, fmt='.0f') if hit else 'never'}"
                        f"{f' ({len(hit)}/{len(rs)} seeds)' if 0 < len(hit) < len(rs) else ''}"
                        f" | {spread([r['best_val'] for r in rs], 100)} |")
            print(row)
        first = next(iter(runs.values()))[0]["buckets"]
        keep = [i for i, b in enumerate(first) if b[3] > 0]
        print("\nexact match % by source length (words), median (min-max) over seeds:\n")
        print("| model | " + " | ".join(f"{first[i][0]}-{first[i][1]}" for i in keep) + " |")
        print("| --- |" + " ---: |" * len(keep))
        for key, rs in runs.items():
            print(f"| {key_label(key)} | " + " | ".join(
                spread([r["buckets"][i][2] for r in rs], 100) for i in keep) + " |")
        print("| (test examples) | " + " | ".join(str(first[i][3]) for i in keep) + " |")
        if plot and not tag.endswith("search"):
            plot_buckets(runs, figures / f"rnn_vs_transformer_length_{tag}.png", title)


@torch.no_grad()
def plot_alignment(model: RNNSeq2Seq, numbers: tuple[int, ...], path: Path) -> str:
    """Heatmap of the additive model's attention (output digits x input words) while it
    decodes ``numbers`` greedily; returns what it decoded."""
    lists = len(numbers) > 1
    src_tok, tgt_tok = source_tokenizer(separator=lists), target_tokenizer(separator=lists)
    src = torch.tensor([src_tok.encode(numbers_to_words(numbers))])
    out = model.generate(src)
    _, maps = model(src, out, return_attention=True)
    weights = maps.cross_attn[0][:, 0]  # the one layer, one head: (B, T, S)
    digits = tgt_tok.decode(out[0, 1:].tolist())
    steps = len(digits) + 1  # the digits and [EOS]
    plt = pyplot()
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


@torch.no_grad()
def plot_cross_attention(model: Seq2Seq, numbers: tuple[int, ...], path: Path) -> str:
    """The transformer's cross-attention (output digits x input words) while it decodes
    ``numbers`` greedily: one panel per decoder layer, averaged over heads, and the last
    layer's heads. Returns what it decoded."""
    src_tok, tgt_tok = source_tokenizer(separator=True), target_tokenizer(separator=True)
    src = torch.tensor([src_tok.encode(numbers_to_words(numbers))])
    out = model.generate(src, max_new_tokens=model.config.max_target_len - 1)
    memory, pad = model.encode(src)
    _, maps = model.decoder.forward_features(out, memory=memory, memory_padding_mask=pad,
                                             return_attention=True)  # AttentionMaps
    digits = tgt_tok.decode(out[0, 1:].tolist())
    steps = min(len(digits) + 1, out.shape[1])
    cross = [m[0, :, :steps].float() for m in maps.cross_attn]  # (heads, T, S) per layer
    panels = [(f"layer {i + 1}, mean of heads", m.mean(0)) for i, m in enumerate(cross)]
    panels += [(f"layer {len(cross)}, head {h + 1}", cross[-1][h])
               for h in range(cross[-1].shape[0])]
    words = [src_tok.decode([i]) for i in src[0].tolist()]
    plt = pyplot()
    ncols = 2
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(0.2 * len(words) * ncols + 2,
                                                    (0.16 * steps + 1.2) * nrows), dpi=120,
                             squeeze=False)
    for ax, (title, m) in zip(axes.flat, panels, strict=False):
        ax.imshow(m.numpy(), cmap="Greys", vmin=0.0, vmax=float(m.max()), aspect="auto")
        ax.set_xticks(range(len(words)), words, rotation=75, ha="right", fontsize=5)
        ax.set_yticks(range(steps), [*digits, "[EOS]"][:steps], fontsize=5)
        ax.set_title(title, fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"transformer cross-attention, {','.join(map(str, numbers))} -> {digits}",
                 fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    return digits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=120.0, help="CPU seconds per model")
    parser.add_argument("--models", nargs="+", type=model_name,
                        default=["gru", "gru+additive", "gru+multiplicative", "transformer"],
                        help=f"from {MODELS}; the transformer also as a variant, e.g. "
                             "transformer:pos=rope,dim=96,depth=1,mlp=3 (keys: "
                             f"{', '.join(TRANSFORMER_DEFAULTS)}); any model with its own "
                             "recipe: gru@lr=3e-3,warmup=1")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--numbers-per-source", type=int, default=1,
                        help="K > 1: lists of 1..K numbers per example")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=float, default=0.05,
                        help="linear warm-up over this fraction of the budget (--converge: of "
                             "--check-every, then a constant learning rate)")
    parser.add_argument("--rounds", type=int, default=5, help="throughput rounds (0: none)")
    parser.add_argument("--steps", type=int, default=10, help="training steps per round")
    parser.add_argument("--figures", default="docs/figures")
    parser.add_argument("--results", default="runs/rnn_vs_transformer.jsonl",
                        help="one JSON line per (model, seed) is appended here")
    parser.add_argument("--report", nargs="+", metavar="FILE",
                        help="only print the tables and draw the figure from result files")
    parser.add_argument("--converge", action="store_true",
                        help="train each model until validation exact match stops improving "
                             "(--budget is then the CPU-second cap)")
    parser.add_argument("--check-every", type=float, default=30.0,
                        help="--converge: CPU seconds of training between validations")
    parser.add_argument("--patience", type=int, default=4,
                        help="--converge: validations without a new best before stopping")
    parser.add_argument("--grid", nargs="+", type=grid_point, metavar="LR:WARMUP",
                        help="--converge: first train every model without its own @recipe "
                             "at each (lr, warm-up) point for --search-budget CPU s (first "
                             "seed), then converge it with the point of best validation "
                             "exact match")
    parser.add_argument("--search-budget", type=float, default=40.0,
                        help="--grid: CPU seconds of training per point")
    parser.add_argument("--train-numbers", type=int, default=None, metavar="M",
                        help="length generalisation: train (and validate) on lists of 1..M "
                             "numbers, test on lists of 1..K (--numbers-per-source K)")
    parser.add_argument("--length-throughput", nargs="*", type=int, metavar="L",
                        help="only measure training tokens per CPU second against source "
                             "length L (default 10 25 50 100 200), appended to --results")
    parser.add_argument("--test-size", type=int, default=2000, help="held-out test lists")
    parser.add_argument("--save", metavar="DIR",
                        help="save each trained model's state dict here (to redraw figures)")
    parser.add_argument("--cross-attention", action="store_true",
                        help="draw the cross-attention of each trained transformer (seed 0)")
    args = parser.parse_args()
    figures = Path(args.figures)
    if args.report:
        report(args.report, figures)
        return
    torch.set_num_threads(1)
    results = Path(args.results)
    results.parent.mkdir(parents=True, exist_ok=True)

    names = [parse_recipe(spec)[0] for spec in args.models]
    k = args.numbers_per_source
    vocab, buckets = sizes(k), buckets_for(k)

    def build(name: str, seed: int, vocab: dict[str, int] = vocab) -> nn.Module:
        torch.manual_seed(0)
        base, opts = parse_variant(name)
        # the RNNs match the default transformer; a long-input one uses fixed positions
        long = {"pos": "sinusoidal"} if vocab["max_source_len"] > 128 else {}
        target = n_params(transformer(vocab, long))
        torch.manual_seed(seed)
        if base == "transformer":
            return transformer(vocab, {**long, **opts})
        cell, _, attention = base.partition("+")
        return rnn_matching(target, attention or "none", cell, vocab)

    if args.length_throughput is not None:
        lengths = args.length_throughput or [10, 25, 50, 100, 200]
        long_vocab = {**vocab, "max_source_len": max(256, max(lengths))}
        rows = length_throughput(names, lengths, 32, min(16, vocab["max_target_len"]),
                                 max(args.rounds, 1), args.steps,
                                 long_vocab, lambda n, v: build(n, 0, v))
        with results.open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        print("| model | parameters | " + " | ".join(f"L={x}" for x in lengths) + " |")
        print("| --- | ---: |" + " ---: |" * len(lengths))
        for name in names:
            rs = [r for r in rows if r["model"] == name]
            print(f"| {label(name)} | {rs[0]['params']:,} | " + " | ".join(
                spread(r["tokens_per_cpu_s"], fmt=",.0f") for r in rs) + " |")
        plot_length_throughput(rows, figures / "rnn_vs_transformer_tokens_per_s_length.png")
        return

    def split_pairs(dm: NumberWordsDataModule, split: str) -> list[tuple[list[int], list[int]]]:
        data = dm.split_dataset(split)
        return [data[i] for i in range(len(data))]

    dm = NumberWordsDataModule(train_size=50_000, held_out=10_000, val_size=500,
                               test_size=args.test_size, batch_size=128, numbers_per_source=k)
    train_dm = dm
    if args.train_numbers is not None:
        if not 1 <= args.train_numbers < k:
            raise SystemExit(f"--train-numbers must be in [1, {k}), got {args.train_numbers}")
        train_dm = NumberWordsDataModule(train_size=50_000, held_out=10_000, val_size=500,
                                         test_size=args.test_size, batch_size=128,
                                         numbers_per_source=args.train_numbers)
        if k > 1 and args.train_numbers == 1:
            raise SystemExit("--train-numbers 1 has no separator in its vocabulary; use >= 2")
    train_set = train_dm.split_dataset("train")
    pairs, val_pairs = split_pairs(dm, "test"), split_pairs(train_dm, "val")
    mode = "extrapolate" if args.train_numbers else "converge" if args.converge else "budget"

    rates: dict[str, list[float]] = {}
    if args.rounds:
        def first_loader() -> DataLoader:
            return DataLoader(train_set, batch_size=128, shuffle=True, collate_fn=collate_pairs,
                              generator=torch.Generator().manual_seed(0))
        batches = [b for b, _ in zip(first_loader(), range(4), strict=False)]
        rates = throughput({m: build(m, 0) for m in names}, batches, args.rounds,
                           args.steps)

    def run(name: str, seed: int, lr: float, warmup: float, budget: float, patience: int,
            run_mode: str) -> dict:
        """Trains one model with one seed and recipe, tests it, appends its result line."""
        def loader() -> DataLoader:
            return DataLoader(train_set, batch_size=128, shuffle=True, collate_fn=collate_pairs,
                              generator=torch.Generator().manual_seed(seed))

        model = build(name, seed)
        if args.converge:
            def check() -> float:
                return evaluate(model, val_pairs, buckets, vocab["max_target_len"])[0]
            stats = train_converge(model, loader, budget, lr, warmup, check, args.check_every,
                                   patience)
        else:
            stats = train(model, loader, budget, lr, warmup)
        em, by_bucket = evaluate(model, pairs, buckets, vocab["max_target_len"])
        row = {"model": name, "seed": seed, "numbers_per_source": k, "budget": budget,
               "mode": run_mode, "train_numbers": args.train_numbers, "lr": lr, "warmup": warmup,
               "params": n_params(model),
               "hidden": getattr(model.config, "hidden_dim", None) or model.config.dim,
               **stats, "exact_match": em, "buckets": by_bucket,
               "tokens_per_s": rates.get(name, []) if seed == args.seeds[0] else []}
        with results.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"seed {seed} {label(name)} (lr {lr:g}, warm-up {warmup:g}): {stats['steps']} "
              f"steps, loss {stats['loss']:.4f}, exact match {100 * em:.2f} % ("
              + ", ".join(f"{lo}-{hi}: {100 * r:.0f}" for lo, hi, r, n in by_bucket if n)
              + ")", flush=True)
        if run_mode == "search":
            return row
        if args.save:
            Path(args.save).mkdir(parents=True, exist_ok=True)
            torch.save(model.state_dict(), Path(args.save) / f"{run_mode}_{name}_{seed}.pt")
        if name == "gru+additive" and seed == args.seeds[0]:
            assert isinstance(model, RNNSeq2Seq)
            example = (345_678,) if k == 1 else (345_678, 12, 9005, 770_001)[:k]
            tag = "gru" if k == 1 else f"gru_lists{k}"
            digits = plot_alignment(model, example, figures / f"rnn_additive_alignment_{tag}.png")
            print(f"alignment figure: {example} decoded as {digits!r}", flush=True)
        if args.cross_attention and isinstance(model, Seq2Seq) and k > 1 \
                and seed == args.seeds[0]:
            example = (345_678, 12, 9005, 770_001)[:k]
            tag = name.replace(":", "_").replace(",", "_").replace("=", "")
            digits = plot_cross_attention(
                model, example, figures / f"transformer_cross_attention_{tag}_{run_mode}.png")
            print(f"cross-attention figure: {example} decoded as {digits!r}", flush=True)
        return row

    # each model's recipe: its own @lr=..,warmup=.., else --lr / --warmup, else --grid's best
    recipes: dict[str, tuple[str, float, float]] = {}
    for spec in args.models:
        name, own = parse_recipe(spec)
        recipes[spec] = (name, own.get("lr", args.lr), own.get("warmup", args.warmup))
    if args.grid:
        if not args.converge:
            raise SystemExit("--grid needs --converge (it picks by validation exact match)")
        for spec, (name, _, _) in recipes.items():
            if "@" in spec:  # a stated recipe is not searched
                continue
            trials = [(run(name, args.seeds[0], lr, warmup, args.search_budget, 10**9,
                           "search"), lr, warmup) for lr, warmup in args.grid]
            # best validation exact match; a tie (e.g. all 0 %) goes to the lower final loss
            row, lr, warmup = max(trials, key=lambda t: (t[0]["best_val"], -t[0]["loss"]))
            recipes[spec] = (name, lr, warmup)
            print(f"recipe for {label(name)}: lr {lr:g}, warm-up {warmup:g} (val "
                  f"{100 * row['best_val']:.1f} %)", flush=True)

    for seed in args.seeds:
        for name, lr, warmup in recipes.values():
            run(name, seed, lr, warmup, args.budget, args.patience, mode)
    report([str(results)], figures)


if __name__ == "__main__":
    main()
