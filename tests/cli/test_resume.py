"""Exact mid-epoch resume: a fit killed after any step and resumed from that step's
checkpoint ends with the weights of the uninterrupted fit, bit for bit (one CPU thread), and
trains on every example of each epoch exactly once (#32). Helpers: tests/resume_runs.py."""

from __future__ import annotations

from collections import Counter

from torch.utils.data import default_collate

import multimodal as mm
from multimodal.data.vision import ImageClassificationDataModule
from multimodal.tasks import ClassificationTask
from tests.resume_runs import (
    assert_each_once_per_epoch,
    assert_same_run,
    example_ids,
    fit,
    interrupted,
)

DIGITS_VIT = dict(image_size=8, patch_size=2, in_channels=1, num_classes=10, dim=32, depth=2,
                  heads=4, mlp_dim=64, pool="mean")


def digits(num_workers: int = 0, augment: bool = True):
    def make():
        task = ClassificationTask(mm.ViT(mm.ViTConfig(**DIGITS_VIT)), optimizer={"lr": 3e-3})
        data = ImageClassificationDataModule("digits", batch_size=16, val_size=32,
                                             limit_train=80, augment=augment, flip=augment,
                                             num_workers=num_workers)
        return task, data
    return make


def test_images_resume_mid_epoch_exactly(tmp_path):
    whole, record = fit(digits(), tmp_path / "whole", epochs=3)
    resumed, seen = interrupted(digits(), tmp_path / "cut", epochs=3, kills=[7, 12])
    assert [s for _, s, _ in seen] == list(range(15))
    assert seen == record.seen  # same batches, same order
    assert_each_once_per_epoch(seen, 80)
    assert_same_run(whole, resumed)


def test_worker_processes_resume_mid_epoch_exactly(tmp_path):
    """num_workers > 0: workers read ahead of the training step; the position is the
    batches trained on, not the indices read; the random shifts and flips drawn in the
    workers are seeded per item and epoch, so they are replayed too."""
    make = digits(num_workers=2, augment=True)
    whole, record = fit(make, tmp_path / "whole", epochs=2)
    resumed, seen = interrupted(make, tmp_path / "cut", epochs=2, kills=[3])
    assert seen == record.seen
    assert_each_once_per_epoch(seen, 80)
    assert_same_run(whole, resumed)


def audio_clips(folder):
    import math

    import numpy as np
    import soundfile as sf

    for c, freq in enumerate((300.0, 2000.0)):
        (folder / f"class{c}").mkdir(parents=True, exist_ok=True)
        for i in range(12):
            t = np.arange(int((0.2 + 0.02 * i) * 16000)) / 16000
            wave = (0.3 * np.sin(2 * math.pi * (freq + 10 * i) * t)).astype(np.float32)
            sf.write(str(folder / f"class{c}" / f"{i}.wav"), wave, 16000)
    return str(folder)


def test_audio_resume_mid_epoch_exactly(tmp_path):
    from multimodal.data.audio import AudioClassificationDataModule
    from multimodal.models.audio import AudioClassifier, AudioClassifierConfig

    clips = audio_clips(tmp_path / "clips")

    def make():
        model = AudioClassifier(AudioClassifierConfig(num_classes=2, n_mels=16, dim=16,
                                                      depth=1, heads=2, mlp_dim=32))
        data = AudioClassificationDataModule(train=clips, n_mels=16, batch_size=4,
                                             val_size=2, test_size=2)
        return ClassificationTask(model=model, optimizer={"lr": 3e-3}), data

    whole, record = fit(make, tmp_path / "whole", epochs=2)
    n = sum(len(ids) for e, _, ids in record.seen if e == 0)
    resumed, seen = interrupted(make, tmp_path / "cut", epochs=2, kills=[2, 7])
    assert seen == record.seen
    assert_each_once_per_epoch(seen, n)
    assert_same_run(whole, resumed)


def test_captions_resume_mid_epoch_exactly(tmp_path):
    """Scenes captioning with input (token) dropout: random draws in the training step."""
    from multimodal.data.captions import CaptionDataModule
    from multimodal.models.captioner import Captioner, CaptionerConfig
    from multimodal.tasks.captioning import CaptioningTask

    def make():
        model = Captioner(CaptionerConfig(
            encoder=mm.ViTConfig(image_size=16, patch_size=4, num_classes=0, dim=32, depth=1,
                                 heads=2, mlp_dim=64, pool="mean", class_token=False),
            decoder=mm.TextDecoderConfig(vocab_size=32, max_len=24, dim=32, depth=1, heads=2,
                                         mlp_dim=64)))
        data = CaptionDataModule(dataset="scenes", image_size=16, num_train=60, num_val=8,
                                 num_test=8, batch_size=8)
        return CaptioningTask(model, input_dropout=0.25, num_examples=0), data

    whole, record = fit(make, tmp_path / "whole", epochs=2)
    resumed, seen = interrupted(make, tmp_path / "cut", epochs=2, kills=[5, 11])
    assert seen == record.seen
    assert_each_once_per_epoch(seen, 60)
    assert_same_run(whole, resumed)


def test_text_resume_mid_epoch_exactly(tmp_path):
    """The WordPiece vocabulary is saved once and read back (as ``tokenizer_path`` under
    the run's root does in the configs): HF's trainer may break ties differently per call."""
    from multimodal.data.text import TextCorpusDataModule
    from multimodal.tasks.language_model import LanguageModelTask

    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while",
             "seven", "wizards", "quietly", "hex"]
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "book.txt").write_text("\n\n".join(
        " ".join(words[(i * 7 + k) % len(words)] for k in range(12)) + f" number {i}."
        for i in range(60)) + "\n")

    def make():
        data = TextCorpusDataModule(train=str(tmp_path / "lib"), vocab_size=120, block_size=8,
                                    batch_size=8, val_size=0.2, test_size=0.1,
                                    chunk_chars=150,
                                    tokenizer_path=str(tmp_path / "tokenizer.json"))
        model = mm.TextDecoder(mm.TextDecoderConfig(vocab_size=120, max_len=8, dim=32,
                                                    depth=2, heads=2))
        return LanguageModelTask(model), data

    whole, record = fit(make, tmp_path / "whole", epochs=2)
    _, data = make()
    data.setup("fit")
    blocks = data.split_dataset("train")
    n = Counter(example_ids(default_collate([blocks[i] for i in range(len(blocks))])))
    steps = len(record.seen) // 2
    resumed, seen = interrupted(make, tmp_path / "cut", epochs=2,
                                kills=[steps // 2, steps + 1])
    assert seen == record.seen
    assert_each_once_per_epoch(seen, n)
    assert_same_run(whole, resumed)


def test_seq2seq_resume_mid_epoch_exactly(tmp_path):
    from multimodal.data.numbers import NumberWordsDataModule
    from multimodal.models.seq2seq import Seq2Seq, Seq2SeqConfig
    from multimodal.tasks.seq2seq import Seq2SeqTask

    def make():
        data = NumberWordsDataModule(train_size=96, held_out=40, val_size=8, test_size=8,
                                     batch_size=16)
        model = Seq2Seq(Seq2SeqConfig(
            source_vocab_size=data.source_vocab_size, target_vocab_size=data.target_vocab_size,
            max_source_len=24, max_target_len=12, dim=32, encoder_depth=1, decoder_depth=1,
            heads=2, mlp_dim=64))
        return Seq2SeqTask(model, optimizer={"lr": 3e-3}), data

    whole, record = fit(make, tmp_path / "whole", epochs=2)
    resumed, seen = interrupted(make, tmp_path / "cut", epochs=2, kills=[4, 8])
    assert seen == record.seen
    assert_each_once_per_epoch(seen, 96)
    assert_same_run(whole, resumed)


def test_a_loader_rebuilt_for_ddp_keeps_the_position():
    """Lightning rebuilds the training loader around a DistributedSampler (from the
    arguments it captured); the rebuilt one keeps the data module's position, and a rank
    resumed mid-epoch continues its own share where it stopped."""
    from lightning.fabric.utilities.data import _replace_dunder_methods
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
    from lightning.pytorch.utilities.data import _update_dataloader
    from torch.utils.data import DataLoader

    def rank_loader(data):
        with _replace_dunder_methods(DataLoader, "dataset"):
            loader = data.train_dataloader()
        sampler = DistributedSamplerWrapper(loader.sampler, num_replicas=2, rank=1,
                                            shuffle=False)
        rebuilt = _update_dataloader(loader, sampler)
        rebuilt.sampler.set_epoch(1)
        return rebuilt

    _, data = digits(augment=False)()
    data.setup("fit")
    loader = rank_loader(data)
    assert loader.position is data.train_position
    whole = [example_ids(b) for b in loader]
    it = iter(loader)
    first = [example_ids(next(it)) for _ in range(2)]
    state = data.state_dict()
    _, again = digits(augment=False)()
    again.setup("fit")
    again.load_state_dict(state)
    rest = [example_ids(b) for b in rank_loader(again)]
    assert first + rest == whole and len(whole) == 3  # 40 of the 80 images, 16 a batch
