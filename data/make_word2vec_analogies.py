"""The analogy questions of ``benchmarks/word2vec.py``: ``data/word2vec_analogies.txt``, in
the questions-words format of the word2vec tool (``: section`` lines, then ``a b c d`` =
"a is to b as c is to d"), which gensim's ``KeyedVectors.evaluate_word_analogies`` reads.

    python data/make_word2vec_analogies.py [OUT]      (default data/word2vec_analogies.txt)

How the set is built: three relations the offline corpora (``bash data/get_text.sh``: KJV
Bible, fortunes, Shakespeare) support, written by hand below as candidate word pairs; a
pair is kept when both words occur at least ``MIN_COUNT`` = 100 times in the three corpora
together (tokenised by ``multimodal.data.word2vec.tokenize``); every ordered pair of two
kept pairs of a section is one question (``n`` pairs give ``n (n - 1)`` questions).
Deterministic: the same corpora give the same file.

- ``family``: male / female forms (king / queen, father / mother, he / she ...);
- ``plural``: singular / plural nouns (day / days, child / children, foot / feet ...);
- ``past-tense``: verb / its past tense, the Bible's forms included (speak / spake,
  smite / smote).
"""

from __future__ import annotations

import sys
from collections import Counter
from itertools import permutations
from pathlib import Path

MIN_COUNT = 100

CANDIDATES: dict[str, str] = {
    "family": """king queen, father mother, son daughter, brother sister, man woman,
        husband wife, he she, his her, boy girl, lord lady, prince princess, sons daughters,
        brothers sisters, men women, kings queens, fathers mothers, master mistress,
        duke duchess, sir madam, uncle aunt, gentleman gentlewoman, bridegroom bride,
        boys girls, husbands wives""",
    "plural": """day days, year years, hand hands, city cities, house houses, eye eyes,
        word words, thing things, name names, land lands, heart hearts, child children,
        servant servants, friend friends, enemy enemies, horse horses, tree trees, god gods,
        head heads, foot feet, tooth teeth, way ways, hour hours, night nights, book books,
        soul souls, voice voices, star stars, fire fires, sword swords, door doors,
        gate gates, field fields, river rivers, mountain mountains, stone stones,
        bird birds, wall walls, time times, life lives, knee knees, priest priests,
        ship ships, letter letters, tongue tongues""",
    "past-tense": """go went, come came, say said, give gave, take took, see saw,
        know knew, make made, speak spake, hear heard, stand stood, sit sat, find found,
        bring brought, tell told, eat ate, fall fell, rise rose, run ran, write wrote,
        send sent, think thought, keep kept, leave left, die died, love loved, begin began,
        get got, drink drank, sing sang, smite smote, slay slew, bear bare, lie lay,
        dwell dwelt, build built, weep wept""",
}


def pairs(section: str) -> list[tuple[str, str]]:
    out = []
    for item in CANDIDATES[section].split(","):
        a, b = item.split()
        out.append((a, b))
    return out


def build(counts: Counter[str], min_count: int = MIN_COUNT) -> list[str]:
    """The file's lines for word ``counts``."""
    lines = []
    for section in CANDIDATES:
        kept = [(a, b) for a, b in pairs(section) if min(counts[a], counts[b]) >= min_count]
        lines.append(f": {section}")
        lines.extend(f"{a} {b} {c} {d}" for (a, b), (c, d) in permutations(kept, 2))
    return lines


def main(argv: list[str]) -> None:
    from multimodal.data.word2vec import corpus_sentences

    out = Path(argv[0]) if argv else Path(__file__).with_name("word2vec_analogies.txt")
    counts: Counter[str] = Counter(w for s in corpus_sentences() for w in s)
    lines = build(counts)
    out.write_text("\n".join(lines) + "\n")
    sections = sum(line.startswith(":") for line in lines)
    print(f"{out}: {len(lines) - sections} questions in {sections} sections")


if __name__ == "__main__":
    main(sys.argv[1:])
