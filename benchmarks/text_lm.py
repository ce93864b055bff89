"""A small GPT-style decoder against smoothed bigram baselines, on the same held-out tokens.

Both models see the same WordPiece tokenizer (trained on the training documents) and are
scored on the same test blocks of :class:`~multimodal.data.text.TextCorpusDataModule`
(documents never seen in training): every position ``t`` of a block predicts token
``t + 1``. The bigram conditions on the current token only; the decoder on the block so far.

Baselines, from the bigram counts ``c(v, w)`` of the training blocks (V = vocabulary size):

* add-one: ``P(w | v) = (c(v, w) + 1) / (c(v) + V)``;
* interpolated Kneser-Ney: ``P(w | v) = max(c(v, w) - D, 0) / c(v)
  + D N1+(v .) / c(v) * P_cont(w)`` with ``P_cont(w) = (N1+(. w) + 1) / (N1+(. .) + V)``
  (continuation counts, add-one smoothed) and ``D = n1 / (n1 + 2 n2)``; an unseen context
  ``v`` falls back to ``P_cont``.

Perplexity = ``exp(mean NLL per token)``. Then greedy and nucleus-sampled continuations of
a prompt, and nearest neighbours / an analogy in the decoder's token embedding.

Run: ``PYTHONPATH=. python benchmarks/text_lm.py`` (needs ``bash data/get_text.sh``;
about 11 minutes on one CPU thread; ``--minutes`` sets the training budget).
"""

from __future__ import annotations

import argparse
import math
import time

import lightning as L
import torch

from multimodal.data.text import TextCorpusDataModule
from multimodal.embeddings import analogy, nearest_neighbours
from multimodal.models.text import TextDecoder, TextDecoderConfig
from multimodal.tasks.language_model import LanguageModelTask


def bigram_counts(blocks: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``c[v, w]`` = how often ``w`` follows ``v`` inside the (N, L + 1) blocks."""
    prev, nxt = blocks[:, :-1].reshape(-1), blocks[:, 1:].reshape(-1)
    flat = torch.bincount(prev * vocab_size + nxt, minlength=vocab_size * vocab_size)
    return flat.view(vocab_size, vocab_size).double()


def add_one_bigram(counts: torch.Tensor) -> torch.Tensor:
    """log P(w | v) with add-one (Laplace) smoothing."""
    v = counts.shape[0]
    return ((counts + 1) / (counts.sum(1, keepdim=True) + v)).log()


def kneser_ney_bigram(counts: torch.Tensor, discount: float | None = None) -> torch.Tensor:
    """log P(w | v) of the interpolated Kneser-Ney bigram (see the module docstring)."""
    v = counts.shape[0]
    if discount is None:
        n1, n2 = float((counts == 1).sum()), float((counts == 2).sum())
        discount = n1 / (n1 + 2 * n2) if n1 + n2 > 0 else 0.75
    seen = (counts > 0).double()
    cont = (seen.sum(0) + 1) / (seen.sum() + v)  # P_cont(w)
    context = counts.sum(1, keepdim=True)
    safe = context.clamp(min=1)
    backoff = discount * seen.sum(1, keepdim=True) / safe
    probs = (counts - discount).clamp(min=0) / safe + backoff * cont[None]
    probs = torch.where(context > 0, probs, cont[None].expand(v, v))
    return probs.log()


def bigram_nll(log_probs: torch.Tensor, blocks: torch.Tensor) -> float:
    """Mean NLL per predicted token of the (N, L + 1) blocks."""
    prev, nxt = blocks[:, :-1].reshape(-1), blocks[:, 1:].reshape(-1)
    return float(-log_probs[prev, nxt].mean())


def steps_in_budget(config: TextDecoderConfig, dm: TextCorpusDataModule,
                    minutes: float, probe_steps: int = 8) -> int:
    """How many training steps fit in ``minutes``: times a few steps of a throw-away copy
    of the model (the machine may be shared, so this is measured, not assumed)."""
    model = TextDecoder(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = iter(dm.train_dataloader())
    times = []
    for _ in range(probe_steps + 2):
        batch = next(batches)
        start = time.perf_counter()
        logits = model(batch["input_ids"])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1),
                                                 batch["targets"].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - start)
    per_step = sorted(times[2:])[len(times[2:]) // 2] * 1.1  # median + 10% for logging, val
    steps = max(10, int(minutes * 60 / per_step))
    print(f"{per_step:.3f} s per step measured -> {steps} steps in {minutes} min")
    return steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sources", nargs="+", default=["bible"])
    ap.add_argument("--vocab-size", type=int, default=2000)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--max-steps", type=int, default=None,
                    help="training steps (default: as many as --minutes allows, measured)")
    ap.add_argument("--minutes", type=float, default=10.0, help="training time budget")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt", default="and the lord said unto moses")
    ap.add_argument("--new-tokens", type=int, default=30)
    ap.add_argument("--neighbours", nargs="*", default=["god", "king", "son", "water"])
    ap.add_argument("--analogy", nargs=3, default=["man", "king", "woman"])
    ap.add_argument("--save-dir", default=None, help="save_pretrained folder for the decoder")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    L.seed_everything(args.seed, verbose=False)
    t0 = time.perf_counter()
    dm = TextCorpusDataModule(sources=args.sources, vocab_size=args.vocab_size,
                              block_size=args.block_size, batch_size=args.batch_size,
                              seed=args.seed)
    dm.setup("fit")
    tok = dm.tokenizer
    vocab = tok.vocab_size
    train_blocks, test_blocks = dm.datasets["train"].blocks, dm.datasets["test"].blocks
    print(f"data: sources={args.sources} vocab={vocab} train={train_blocks.numel():,} "
          f"test={test_blocks[:, 1:].numel():,} predicted tokens "
          f"({time.perf_counter() - t0:.0f} s to read + tokenise)")

    counts = bigram_counts(train_blocks, vocab)
    results = {name: math.exp(bigram_nll(fn(counts), test_blocks))
               for name, fn in (("bigram add-one", add_one_bigram),
                                ("bigram Kneser-Ney", kneser_ney_bigram))}

    config = TextDecoderConfig(vocab_size=vocab, max_len=args.block_size, dim=args.dim,
                               depth=args.depth, heads=args.heads)
    steps = args.max_steps or steps_in_budget(config, dm, args.minutes)
    model = TextDecoder(config)
    task = LanguageModelTask(model, optimizer={"lr": args.lr, "warmup_fraction": 0.05,
                                                "min_lr_ratio": 0.1})
    # the cosine schedule is planned for `steps`; max_time is only a safety net
    trainer = L.Trainer(max_steps=steps, max_time={"minutes": 1.5 * args.minutes + 1},
                        accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        val_check_interval=min(500, steps), check_val_every_n_epoch=None,
                        limit_val_batches=20,
                        gradient_clip_val=1.0)
    t1 = time.perf_counter()
    trainer.fit(task, datamodule=dm)
    train_s = time.perf_counter() - t1
    nll = task.evaluate(dm.test_dataloader())
    results["decoder"] = nll.perplexity
    params = sum(p.numel() for p in model.parameters())

    print(f"\ndecoder: dim={args.dim} depth={args.depth} heads={args.heads} "
          f"params={params:,}; {trainer.global_step} steps x {args.batch_size} x "
          f"{args.block_size} tokens in {train_s:.0f} s ({args.threads} CPU thread(s))")
    print("\n| model | test perplexity |\n| --- | --- |")
    for name, ppl in results.items():
        print(f"| {name} | {ppl:.1f} |")
    best_bigram = min(v for k, v in results.items() if k.startswith("bigram"))
    print(f"\nbest bigram / decoder perplexity = {best_bigram / results['decoder']:.2f}x")

    prompt = torch.tensor([[tok.eos_token_id, *tok.encode(args.prompt)]])
    gen = torch.Generator().manual_seed(args.seed)
    for name, kw in (("greedy", {}), ("top-p 0.9", {"do_sample": True, "top_p": 0.9,
                                                     "generator": gen})):
        out = model.generate(prompt, args.new_tokens, **kw)
        print(f"{name:>9}: {tok.decode(out[0, 1:].tolist(), clean_up_spaces=True)}")
    for word in args.neighbours:
        if tok.token_to_id(word) is not None:
            near = nearest_neighbours(model, tok, word, k=5)
            print(f"nearest to {word!r}: " + ", ".join(f"{w} {s:.2f}" for w, s in near))
    a, b, c = args.analogy
    if all(tok.token_to_id(w) is not None for w in (a, b, c)):
        got = analogy(model, tok, a, b, c, k=5)
        print(f"{a} : {b} = {c} : ? -> " + ", ".join(f"{w} {s:.2f}" for w, s in got))
    if args.save_dir:
        model.save_pretrained(args.save_dir)
        tok.save(f"{args.save_dir}/tokenizer.json")
        print(f"model and tokenizer saved to {args.save_dir}")
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
