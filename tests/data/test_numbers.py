"""Lists of numbers per source (NumberWordsDataModule(numbers_per_source=K)): the long inputs
of the RNN-vs-transformer length benchmark."""

from __future__ import annotations

import pytest

from multimodal.data.numbers import (
    NumberWordsDataModule,
    number_to_words,
    numbers_to_digits,
    numbers_to_words,
    source_tokenizer,
    target_tokenizer,
    words_to_number,
)


def small(k: int) -> NumberWordsDataModule:
    return NumberWordsDataModule(train_size=3000, held_out=600, val_size=100, test_size=300,
                                 numbers_per_source=k)


def test_lists_join_words_and_digits_with_a_separator() -> None:
    assert numbers_to_words((12, 305)) == "twelve , three hundred and five"
    assert numbers_to_digits((12, 305)) == "12,305"
    assert numbers_to_words((7,)) == "seven"
    with pytest.raises(ValueError, match="numbers is empty"):
        numbers_to_words(())
    with pytest.raises(ValueError, match="numbers is empty"):
        numbers_to_digits([])


def test_the_separator_is_a_new_last_id_and_moves_no_other() -> None:
    for plain, lists in ((source_tokenizer(), source_tokenizer(separator=True)),
                         (target_tokenizer(), target_tokenizer(separator=True))):
        assert lists.vocab_size == plain.vocab_size + 1
        assert lists.vocab[: plain.vocab_size] == plain.vocab
        assert lists.vocab[-1] == ","
    assert source_tokenizer(separator=True).encode("twelve , five") == [
        source_tokenizer().encode("twelve")[0], 39, source_tokenizer().encode("five")[0]]


def test_one_number_per_source_is_the_plain_task() -> None:
    dm = small(1)
    assert (dm.source_vocab_size, dm.target_vocab_size) == (39, 17)
    test = dm.split_dataset("test")
    src, tgt = source_tokenizer(), target_tokenizer()
    for i in range(20):
        n = dm.numbers["test"][i]
        assert test[i] == (src.encode(number_to_words(n)),
                           tgt.encode(str(n), add_bos=True, add_eos=True))


def test_lists_hold_one_to_k_numbers_of_their_own_split_only() -> None:
    dm = small(3)
    dm.setup()
    assert (dm.source_vocab_size, dm.target_vocab_size) == (40, 18)
    for split in ("train", "val", "test"):
        lists = dm.lists[split]
        assert len(lists) == len(dm.numbers[split])
        assert {len(x) for x in lists} == {1, 2, 3}
        assert {n for x in lists for n in x} <= set(dm.numbers[split])
    held = set(dm.numbers["val"]) | set(dm.numbers["test"])
    assert not {n for x in dm.lists["train"] for n in x} & held
    # the data are a function of the seed
    again = small(3)
    again.setup()
    assert again.lists == dm.lists


def test_list_pairs_decode_back_to_their_numbers() -> None:
    dm = small(4)
    data = dm.split_dataset("test")
    src, tgt = source_tokenizer(separator=True), target_tokenizer(separator=True)
    lengths = set()
    for i in range(200):
        source, target = data[i]
        words = [w.strip() for w in src.decode(source).replace(" - ", "-").split(",")]
        digits = tgt.decode(target).split(",")
        assert [words_to_number(w) for w in words] == [int(d) for d in digits]
        assert tuple(int(d) for d in digits) == dm.lists["test"][i]
        lengths.add(len(source))
    assert max(lengths) > 24  # longer than any single number's words


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_numbers_per_source_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="numbers_per_source must be an integer >= 1"):
        NumberWordsDataModule(numbers_per_source=bad)  # type: ignore[arg-type]
