"""Contrastive (CLIP) vs generative (captioner) on the held-out scenes, one run.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/clip_scenes.py \
        --clip runs/clip_scenes/version_0/checkpoints/last.ckpt \
        --captioner runs/caption_scenes/version_0/checkpoints/last.ckpt [--figures docs/figures]

(a) zero-shot classification of single-shape scenes among all 24 "colour shape" classes,
    on held-out pairs (never in training) and on seen pairs separately;
(b) image->text and text->image recall@1/5 among the 1 000 test scenes and their captions
    (a caption identical to the true one counts as correct).

CLIP scores a class from the scaled cosines of the image with the class's prompts
("a small {}", "a large {}"), either as CLIP's prompt ensemble (``mean``: the cosine with
the renormalised mean of the two prompt embeddings) or as the probability of either prompt
(``sum``: one softmax over all 48 prompts, summed per class; the default and the
counterpart of the captioner's logsumexp). The captioner, used as a classifier, scores
every candidate caption c by its log-likelihood
``log p(c | image) = Σ_t log p(c_t | c_<t, image)`` and a class by ``logsumexp`` over the
two size captions (p(small or large colour shape)).
Retrieval ranks captions (i->t) or images (t->i) by the same log-likelihood.
With ``--figures`` it also writes the similarity matrix of test images against the
prompts and the learned temperature over training (from the run's metrics.csv).
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path
from typing import Any

import torch

from multimodal.checkpoints import datamodule_arguments, model_from_checkpoint
from multimodal.data.captions import CaptionDataModule
from multimodal.models.captioner import Captioner
from multimodal.models.clip import CLIP, tokenize_texts
from multimodal.tasks.contrastive import recall_at_k
from multimodal.tokenizers.text import PAD_ID, TextTokenizer, load_tokenizer

SIZES = ("small", "large")
TEMPLATES = ("a small {}", "a large {}")


def load(path: str) -> tuple[torch.nn.Module, TextTokenizer, dict[str, Any]]:
    import tempfile

    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "tokenizer.json"
        file.write_text(ckpt["tokenizer"], encoding="utf-8")
        tok = load_tokenizer(file)
    return model_from_checkpoint(ckpt, path), tok, datamodule_arguments(ckpt)


# -- the captioner as a scorer ----------------------------------------------------------------

@torch.no_grad()
def caption_loglik(model: Captioner, tok: TextTokenizer, images: torch.Tensor,
                   captions: list[str], chunk: int = 1000) -> torch.Tensor:
    """(N_images, N_captions) total log-likelihood of each caption given each image."""
    ids = tok.pad(tok.encode_many(captions, add_bos=True, add_eos=True))["input_ids"]
    inputs, targets = ids[:, :-1], ids[:, 1:]
    real = targets != PAD_ID
    out = torch.empty(images.shape[0], len(captions))
    for i in range(images.shape[0]):
        memory = model.encode(images[i:i + 1])
        for s in range(0, len(captions), chunk):
            inp, tgt, m = inputs[s:s + chunk], targets[s:s + chunk], real[s:s + chunk]
            logits = model.decoder(inp, memory=memory.expand(inp.shape[0], -1, -1))
            logp = logits.float().log_softmax(-1).gather(-1, tgt[..., None])[..., 0]
            out[i, s:s + chunk] = (logp * m).sum(-1)
    return out


def captioner_zero_shot(model: Captioner, tok: TextTokenizer, images: torch.Tensor,
                        names: list[str]) -> torch.Tensor:
    """Predicted class per image: argmax over classes of logsumexp over the sizes."""
    captions = [f"a {size} {name}" for name in names for size in SIZES]
    ll = caption_loglik(model, tok, images, captions).view(images.shape[0], len(names),
                                                          len(SIZES))
    return ll.logsumexp(-1).argmax(-1)


@torch.no_grad()
def clip_zero_shot(model: CLIP, tok: TextTokenizer, images: torch.Tensor, names: list[str],
                   ensemble: str = "sum") -> torch.Tensor:
    return model.zero_shot(images, names, TEMPLATES, tokenizer=tok, ensemble=ensemble).argmax(-1)


def per_class(pred: torch.Tensor, data: dict[str, Any]) -> str:
    """Accuracy per true class and its most frequent wrong prediction."""
    names, labels, out = data["class_names"], data["labels"], []
    for lab in labels.unique().tolist():
        rows = pred[labels == lab]
        wrong = rows[rows != lab]
        worst = f", mostly -> {names[int(wrong.mode().values)]}" if len(wrong) else ""
        out.append(f"{names[lab]} {float((rows == lab).float().mean()):.2f}{worst}")
    return "; ".join(out)


def duplicates(captions: list[str]) -> torch.Tensor:
    ids = {c: i for i, c in enumerate(dict.fromkeys(captions))}
    cid = torch.tensor([ids[c] for c in captions])
    return cid[:, None] == cid[None, :]


def retrieval(sim: torch.Tensor, same: torch.Tensor) -> dict[str, float]:
    out = {f"i2t_R@{k}": v for k, v in recall_at_k(sim, same, (1, 5)).items()}
    out.update({f"t2i_R@{k}": v for k, v in recall_at_k(sim.T, same, (1, 5)).items()})
    return out


# -- figures ---------------------------------------------------------------------------------

def plot_similarity(model: CLIP, tok: TextTokenizer, data: dict[str, Any], heldout: set[str],
                    path: Path, n: int = 12) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = data["class_names"]
    with torch.no_grad():
        probs = model.zero_shot(data["images"][:n], names, TEMPLATES, tokenizer=tok,
                                ensemble="sum")
    fig, ax = plt.subplots(figsize=(11, 5.2))
    ax.imshow(probs.numpy(), cmap="viridis", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(names)),
                  [f"{c}{' *' if c in heldout else ''}" for c in names], rotation=70,
                  fontsize=8)
    truth = [names[int(i)] for i in data["labels"][:n]]
    ax.set_yticks(range(n), truth, fontsize=8)
    ax.set_xlabel("prompt class (p(a small {}) + p(a large {}); * = held-out pair)")
    ax.set_ylabel("test image (true class)")
    ax.set_title("CLIP zero-shot probabilities: test images x prompts")
    for i, t in enumerate(truth):
        ax.add_patch(plt.Rectangle((names.index(t) - 0.5, i - 0.5), 1, 1, fill=False,
                                   edgecolor="red", lw=1.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_temperature(metrics_csv: Path, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, scales = [], []
    with metrics_csv.open() as f:
        for row in csv.DictReader(f):
            if row.get("train/logit_scale"):
                steps.append(int(row["step"]))
                scales.append(float(torch.tensor(float(row["train/logit_scale"])).exp()))
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(steps, scales)
    ax.set_xlabel("training step")
    ax.set_ylabel("exp(logit_scale) = 1 / temperature")
    ax.set_title("learned CLIP temperature (scenes)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clip", required=True)
    parser.add_argument("--captioner", default=None)
    parser.add_argument("--zero-shot-n", type=int, default=500)
    parser.add_argument("--captioner-retrieval-n", type=int, default=200,
                        help="retrieval of the captioner on the first N test scenes only "
                             "(N x N caption scorings; 1000 x 1000 is ~50 min on one core); "
                             "CLIP is reported on the same N too")
    parser.add_argument("--figures", default=None)
    parser.add_argument("--metrics", default=None, help="metrics.csv of the CLIP run")
    args = parser.parse_args()
    torch.manual_seed(0)

    clip, clip_tok, dm_args = load(args.clip)
    assert isinstance(clip, CLIP)
    dm = CaptionDataModule(**{**dm_args, "batch_size": 256})
    dm.setup("test")
    test = dm.split_dataset("test")
    images = torch.stack([test[i][0] for i in range(len(test))])
    captions = dm.captions("test")
    same = duplicates(captions)
    sets = {p: dm.zero_shot_set(p, args.zero_shot_n) for p in ("heldout", "seen")}
    config = dm.scene_config()
    heldout_names = {f"{c} {s}" for c, s in config.holdout}
    print(f"test: {len(captions)} scenes ({len(set(captions))} distinct captions); zero-shot: "
          f"{args.zero_shot_n} single-shape scenes per set, {len(sets['seen']['class_names'])} "
          "classes")

    rows: dict[str, dict[str, float]] = {}
    t0 = time.perf_counter()
    with torch.no_grad():
        batch = tokenize_texts(clip_tok, captions, clip.config.text_pool)
        sim = clip.encode_image(images) @ clip.encode_text(**batch).T
    rows["CLIP"] = retrieval(sim, same)
    rows["CLIP"]["retrieval_n"] = len(captions)
    for p, data in sets.items():
        for ensemble in ("sum", "mean"):
            pred = clip_zero_shot(clip, clip_tok, data["images"], data["class_names"], ensemble)
            suffix = "" if ensemble == "sum" else " (mean ensemble)"
            rows.setdefault(f"CLIP{suffix}", {})[f"zero_shot_{p}"] = float(
                (pred == data["labels"]).float().mean())
            if p == "heldout" and ensemble == "sum":
                print(f"CLIP held-out pairs, per class: {per_class(pred, data)}")
    print(f"CLIP scored in {time.perf_counter() - t0:.1f} s")

    if args.captioner:
        cap, cap_tok, cap_args = load(args.captioner)
        assert isinstance(cap, Captioner)
        keys = ("dataset", "image_size", "num_train", "num_test", "max_shapes", "min_shapes",
                "order", "seed")
        differ = [k for k in keys if cap_args.get(k) != dm_args.get(k)]
        if differ:
            raise SystemExit(f"the captioner was trained on other data ({differ}); the "
                             "comparison needs the same scenes and normalisation")
        t0 = time.perf_counter()
        n = args.captioner_retrieval_n
        rows[f"CLIP, first {n} scenes"] = retrieval(sim[:n, :n], same[:n, :n])
        rows["captioner"] = retrieval(
            caption_loglik(cap, cap_tok, images[:n], captions[:n]), same[:n, :n])
        rows["captioner"]["retrieval_n"] = n
        for p, data in sets.items():
            pred = captioner_zero_shot(cap, cap_tok, data["images"], data["class_names"])
            rows["captioner"][f"zero_shot_{p}"] = float((pred == data["labels"]).float().mean())
        print(f"captioner scored in {time.perf_counter() - t0:.1f} s")

    cols = ["zero_shot_heldout", "zero_shot_seen", "retrieval_n", "i2t_R@1", "i2t_R@5",
            "t2i_R@1", "t2i_R@5"]
    print("| model | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, r in rows.items():
        cells = [f"{r[c]:.3f}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols]
        print(f"| {name} | " + " | ".join(cells) + " |")

    if args.figures:
        out = Path(args.figures)
        out.mkdir(parents=True, exist_ok=True)
        mixed = {k: torch.cat([sets["heldout"][k][:6], sets["seen"][k][:6]])
                 for k in ("images", "labels")}
        mixed["class_names"] = sets["seen"]["class_names"]
        plot_similarity(clip, clip_tok, mixed, heldout_names, out / "clip_scenes_similarity.png")
        if args.metrics:
            plot_temperature(Path(args.metrics), out / "clip_scenes_temperature.png")
        print(f"figures written to {out}")


if __name__ == "__main__":
    main()
