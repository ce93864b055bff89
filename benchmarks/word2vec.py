"""Our Word2Vec (``multimodal.models.word2vec``, fused SGD steps) against gensim's
``Word2Vec`` on the same sentences, tokenisation and hyper-parameters.

    python benchmarks/word2vec.py [--sources bible shakespeare] [--max-words N]
                                  [--seeds 0 1 2] [--modes cbow skipgram] [--epochs 5]

For each mode and seed, both train on the same tokenised sentences (dim 100, window 5,
5 negatives, sample 1e-3, min_count 5, lr 0.025 -> 0.0001, both on ``--threads`` threads),
then are scored with the same code:

- analogy accuracy on ``data/word2vec_analogies.txt`` (``data/make_word2vec_analogies.py``
  says how it was built) by 3CosAdd ``argmax_x cos(x, b) - cos(x, a) + cos(x, c)`` and
  3CosMul ``argmax_x c'(x, b) c'(x, c) / (c'(x, a) + 0.001)`` with ``c' = (cos + 1) / 2``
  (Levy & Goldberg 2014), the three question words excluded; a question with a word out of
  the vocabulary is skipped (as gensim's ``evaluate_word_analogies`` does; gensim's own
  3CosAdd score is printed as a check of ours);
- nearest-neighbour overlap: for each word of ``WORDS``, |our top 10 ∩ gensim's top 10| / 10;
  for scale, the same between gensim runs of two seeds (``gensim/gensim``);
- training words per second (corpus words before sub-sampling x epochs / wall time).

Also measured once: the fused ``index_add_`` step against the autograd loss with sparse
embedding gradients + ``torch.optim.SGD`` on the same batches (``--no-step-compare`` skips).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from multimodal.data.word2vec import Batches, Vocabulary, corpus_sentences, encode
from multimodal.models.word2vec import Word2Vec, Word2VecConfig
from multimodal.tasks.word2vec import train_word2vec

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ROOT / "data" / "word2vec_analogies.txt"
WORDS = ["king", "god", "father", "son", "love", "heart", "sword", "city", "water", "day",
         "night", "death", "good", "said", "went", "house", "money", "computer", "queen",
         "eyes"]


def read_questions(path: Path, index: dict[str, int]) -> tuple[dict[str, torch.Tensor], int]:
    """Questions by section as (n, 4) id tensors (those with every word in ``index``) and
    the number of questions in the file."""
    sections: dict[str, list[list[int]]] = {}
    total, name = 0, ""
    for line in path.read_text().splitlines():
        if line.startswith(":"):
            name = line[1:].strip()
            sections.setdefault(name, [])
            continue
        words = line.lower().split()
        if len(words) != 4:
            continue
        total += 1
        if all(w in index for w in words):
            sections[name].append([index[w] for w in words])
    return {k: torch.tensor(v, dtype=torch.long).reshape(-1, 4) for k, v in sections.items()}, \
        total


def analogy_accuracy(vectors: torch.Tensor, questions: dict[str, torch.Tensor]
                     ) -> dict[str, float]:
    """3CosAdd and 3CosMul accuracy (%) over every question (module docstring)."""
    w = torch.nn.functional.normalize(vectors.float(), dim=1)
    q = torch.cat(list(questions.values()))
    hits = {"3cosadd": 0, "3cosmul": 0}
    for s in range(0, q.shape[0], 512):
        a, b, c, d = q[s:s + 512].T
        ca, cb, cc = (w[x] @ w.T for x in (a, b, c))
        add = cb - ca + cc
        mul = ((cb + 1) / 2) * ((cc + 1) / 2) / ((ca + 1) / 2 + 1e-3)
        for name, score in (("3cosadd", add), ("3cosmul", mul)):
            rows = torch.arange(score.shape[0])
            for x in (a, b, c):
                score[rows, x] = -float("inf")
            hits[name] += int((score.argmax(1) == d).sum())
    n = max(q.shape[0], 1)
    return {k: 100.0 * v / n for k, v in hits.items()} | {"questions": q.shape[0]}


def top_k(vectors: torch.Tensor, words: list[str], index: dict[str, int], vocab: list[str],
          k: int = 10) -> dict[str, list[str]]:
    w = torch.nn.functional.normalize(vectors.float(), dim=1)
    out = {}
    for word in words:
        if word not in index:
            continue
        sims = w @ w[index[word]]
        sims[index[word]] = -float("inf")
        out[word] = [vocab[i] for i in sims.topk(k).indices.tolist()]
    return out


def run_gensim(sentences: list[list[str]], mode: str, seed: int, args: argparse.Namespace
               ) -> tuple[list[str], torch.Tensor, float, object]:
    from gensim.models import Word2Vec as GensimWord2Vec

    model = GensimWord2Vec(vector_size=args.dim, window=args.window, negative=args.negatives,
                           hs=0, sg=1 if mode == "skipgram" else 0, cbow_mean=1,
                           min_count=args.min_count, sample=args.sample, alpha=args.lr,
                           min_alpha=args.min_lr, seed=seed, workers=args.threads,
                           epochs=args.epochs)
    model.build_vocab(sentences)
    start = time.perf_counter()
    model.train(sentences, total_examples=model.corpus_count, epochs=args.epochs)
    seconds = time.perf_counter() - start
    words = sum(model.wv.get_vecattr(w, "count") for w in model.wv.index_to_key) * args.epochs
    return list(model.wv.index_to_key), torch.from_numpy(model.wv.vectors.copy()), \
        words / seconds, model.wv


def step_compare(batches: Batches, vocab_size: int, dim: int, steps: int = 50) -> dict:
    """ms per batch: the fused step against autograd with sparse gradients + SGD."""
    gen = torch.Generator().manual_seed(0)
    inputs, predict, mask = batches.examples(gen)
    items = []
    for s in range(0, min(predict.numel(), steps * batches.batch_size), batches.batch_size):
        sl = slice(s, s + batches.batch_size)
        neg = batches.noise(predict[sl].numel(), gen)
        targets = torch.cat([predict[sl, None], neg], 1)
        valid = torch.ones_like(targets, dtype=torch.bool)
        valid[:, 1:] = neg != predict[sl, None]
        items.append((inputs[sl], targets, None if mask is None else mask[sl], valid))
    config = Word2VecConfig(vocab_size=vocab_size, dim=dim, mode=batches.mode)
    fused = Word2Vec(config)
    sparse = Word2Vec(config, sparse=True)
    opt = torch.optim.SGD(sparse.parameters(), lr=0.025)
    times: dict[str, list[float]] = {"fused": [], "sparse_sgd": []}
    for _ in range(3):  # interleaved repeats, medians
        t = time.perf_counter()
        for i, t_, m, v in items:
            fused.sgd_step(i, t_, 0.025, mask=m, valid=v)
        times["fused"].append(time.perf_counter() - t)
        t = time.perf_counter()
        for i, t_, m, v in items:
            opt.zero_grad(set_to_none=True)
            sparse.loss(i, t_, mask=m, valid=v).backward()
            opt.step()
        times["sparse_sgd"].append(time.perf_counter() - t)
    return {k: 1000 * statistics.median(v) / len(items) for k, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sources", nargs="+", default=["bible", "fortunes", "shakespeare"])
    p.add_argument("--max-words", type=int, default=None,
                   help="first N words of each source (default: all)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--modes", nargs="+", default=["cbow", "skipgram"])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--window", type=int, default=5)
    p.add_argument("--negatives", type=int, default=5)
    p.add_argument("--min-count", type=int, default=5)
    p.add_argument("--sample", type=float, default=1e-3)
    p.add_argument("--lr", type=float, default=0.025)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--threads", type=int, default=1,
                   help="threads of both (default 1: on a shared, oversubscribed machine two "
                   "OpenMP threads spin-wait and run 10x slower)")
    p.add_argument("--no-step-compare", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    sentences = corpus_sentences(args.sources, max_words=args.max_words)
    vocab = Vocabulary.build(sentences, min_count=args.min_count)
    index = vocab.index()
    ids, sent = encode(sentences, vocab)
    print(f"corpus: {args.sources} max_words={args.max_words}: {len(sentences)} sentences, "
          f"{ids.numel()} in-vocabulary words, vocabulary {len(vocab)} (min_count "
          f"{args.min_count}); threads {args.threads}; machine shared with other jobs")
    rows = []
    for mode in args.modes:
        g_prev: dict[str, list[str]] | None = None
        batches = Batches(ids, sent, vocab.counts, mode=mode, window=args.window,
                          negatives=args.negatives, sample=args.sample,
                          batch_size=args.batch_size)
        if not args.no_step_compare:
            ms = step_compare(batches, len(vocab), args.dim)
            print(f"{mode}: ms per batch of {args.batch_size}: fused index_add_ "
                  f"{ms['fused']:.2f}, autograd + sparse SGD {ms['sparse_sgd']:.2f} "
                  f"({ms['sparse_sgd'] / ms['fused']:.2f}x)")
        for seed in args.seeds:
            g_words, g_vec, g_wps, g_kv = run_gensim(sentences, mode, seed, args)
            g_index = {w: i for i, w in enumerate(g_words)}
            model = Word2Vec(Word2VecConfig(vocab_size=len(vocab), dim=args.dim, mode=mode))
            stats = train_word2vec(model, batches, epochs=args.epochs, lr=args.lr,
                                   min_lr=args.min_lr, seed=seed)
            ours_q, n_file = read_questions(QUESTIONS, index)
            g_q, _ = read_questions(QUESTIONS, g_index)
            ours = analogy_accuracy(model.vectors, ours_q)
            theirs = analogy_accuracy(g_vec, g_q)
            g_own = 100 * g_kv.evaluate_word_analogies(str(QUESTIONS))[0]
            ours_nn = top_k(model.vectors, WORDS, index, vocab.words)
            g_nn = top_k(g_vec, WORDS, g_index, g_words)
            shared = [w for w in ours_nn if w in g_nn]
            overlap = statistics.mean(len(set(ours_nn[w]) & set(g_nn[w])) / 10
                                      for w in shared)
            g_g = float("nan") if g_prev is None else statistics.mean(
                len(set(g_prev[w]) & set(g_nn[w])) / 10 for w in g_nn if w in g_prev)
            g_prev = g_nn
            row = dict(mode=mode, seed=seed, ours_add=ours["3cosadd"],
                       ours_mul=ours["3cosmul"], gensim_add=theirs["3cosadd"],
                       gensim_mul=theirs["3cosmul"], gensim_own=g_own, overlap=overlap, g_g=g_g,
                       ours_wps=stats["words_per_s"], gensim_wps=g_wps,
                       questions=ours["questions"], g_questions=theirs["questions"])
            rows.append(row)
            print(f"{mode} seed {seed}: 3CosAdd ours {row['ours_add']:.1f} gensim "
                  f"{row['gensim_add']:.1f} (gensim's own evaluator {g_own:.1f}); 3CosMul ours "
                  f"{row['ours_mul']:.1f} gensim {row['gensim_mul']:.1f}; questions "
                  f"{row['questions']}/{n_file} (gensim {row['g_questions']}); NN@10 overlap "
                  f"{overlap:.2f} (gensim/gensim {g_g:.2f}); words/s ours "
                  f"{row['ours_wps']:,.0f} gensim {row['gensim_wps']:,.0f}", flush=True)
    print("\n| model | 3CosAdd ours | 3CosAdd gensim | 3CosMul ours | 3CosMul gensim | "
          "NN@10 overlap (gensim/gensim) | words/s ours | words/s gensim |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for mode in args.modes:
        r = [x for x in rows if x["mode"] == mode]

        def ms(key: str, r: list[dict] = r) -> str:
            vals = [x[key] for x in r]
            sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
            return f"{statistics.mean(vals):.1f} ± {sd:.1f}"

        print(f"| {mode} | {ms('ours_add')} | {ms('gensim_add')} | {ms('ours_mul')} | "
              f"{ms('gensim_mul')} | {statistics.mean(x['overlap'] for x in r):.2f} "
              f"({statistics.mean(x['g_g'] for x in r[1:]) if len(r) > 1 else float('nan'):.2f}) | "
              f"{statistics.median(x['ours_wps'] for x in r):,.0f} | "
              f"{statistics.median(x['gensim_wps'] for x in r):,.0f} |")


if __name__ == "__main__":
    main()
