"""Your own recordings held on the device (#50, item 2): decoded once, batches taken by index
from the seeded epoch permutation, training clips cropped at random per batch and log-mel
features computed there, against the DataLoader path (per-clip crop, collate). Run with
the CPU as the device; the code is the same on an accelerator. Tiny WAV folders."""

from __future__ import annotations

import logging
import math
from collections import Counter

import numpy as np
import pytest
import soundfile as sf
import torch

from multimodal.data.audio import AudioClassificationDataModule
from multimodal.data.audio_batches import BatchAudioCrop
from multimodal.data.device_batches import DeviceBatches
from multimodal.data.sampling import EpochShuffleSampler, ResumableDataLoader


def wav_folder(root, per_class: int = 5, rates=(16000, 8000)) -> str:
    """Two classes of noisy tones, 0.2 - 0.65 s (every clip its own length), at 16 and 8 kHz
    (resampled when read)."""
    gen = np.random.default_rng(0)
    for c, (name, freq) in enumerate([("high", 1500.0), ("low", 300.0)]):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            rate = rates[(i + c) % len(rates)]
            t = np.arange(round((0.2 + 0.1 * i + 0.05 * c) * rate)) / rate
            x = 0.3 * np.sin(2 * math.pi * freq * t) + 0.05 * gen.standard_normal(t.size)
            sf.write(str(root / name / f"{i}.wav"), x.astype(np.float32), rate)
    return str(root)


def modules(root, **kw):
    kw = {"n_mels": 16, "batch_size": 3, "val_size": 2, "test_size": 2, **kw}
    a = AudioClassificationDataModule(train=root, device_resident=False, **kw)
    b = AudioClassificationDataModule(train=root, device_resident=True, **kw)
    a.setup("fit"), b.setup("fit")
    return a, b


def epoch(loader, e):
    loader.sampler.set_epoch(e)
    return list(loader)


def assert_same_batch(x, y, key):
    """The DataLoader's batch pads to its longest clip, the held one to the split's width:
    equal up to the DataLoader's width, zeros after it."""
    width = x[key].shape[1]
    assert torch.equal(x["lengths"], y["lengths"]) and torch.equal(x["label"], y["label"])
    assert torch.equal(x[key], y[key][:, :width])
    assert not y[key][:, width:].any()


@pytest.mark.parametrize("features", [False, True])
def test_held_batches_are_the_dataloader_batches(tmp_path, features):
    """Clips no longer than clip_seconds (no crop): the same waveforms / log-mel features,
    lengths and labels, bit for bit, in every split and epoch."""
    a, b = modules(wav_folder(tmp_path), features=features)
    assert isinstance(a.train_dataloader(), ResumableDataLoader)
    assert isinstance(b.train_dataloader(), DeviceBatches)
    key = "features" if features else "waveform"
    pairs = [p for e in (0, 1) for p in zip(epoch(a.train_dataloader(), e),
                                            epoch(b.train_dataloader(), e), strict=True)]
    for split in ("val", "test"):
        pairs += zip(getattr(a, f"{split}_dataloader")(), getattr(b, f"{split}_dataloader")(),
                     strict=True)
    assert len(pairs) == 2 * 2 + 1 + 1
    for x, y in pairs:
        assert_same_batch(x, y, key)
    for split in ("train", "val", "test"):  # how tasks and callbacks count examples
        assert len(getattr(b, f"{split}_dataloader")().dataset) == \
            len(getattr(a, f"{split}_dataloader")().dataset)


def test_longer_clips_are_cropped_at_random_and_centred_in_evaluation(tmp_path):
    """clip_seconds 0.3: each held training row is a window of n samples of its whole clip
    (decoded independently here), shorter clips whole; validation clips are the
    DataLoader's centre crops bit for bit."""
    root = wav_folder(tmp_path)
    a, b = modules(root, features=False, clip_seconds=0.3)
    n = 4800
    whole = {}
    dataset = a.split_dataset("train")
    for i in range(len(dataset)):
        clip = dataset.waveform(i)
        whole[clip[:400].numpy().tobytes()] = clip
    starts = []
    for batch in epoch(b.train_dataloader(), 2):
        assert batch["waveform"].shape[1] == n
        for row, length in zip(batch["waveform"], batch["lengths"].tolist(), strict=True):
            match = [(c, s) for c in whole.values() for s in range(max(1, c.shape[0] - n + 1))
                     if torch.equal(c[s:s + length], row[:length])]
            assert match and length == min(n, match[0][0].shape[0])
            assert not row[length:].any()
            starts.append(match[0][1])
    assert any(s > 0 for s in starts)  # some clips were cropped away from their start
    for x, y in zip(a.val_dataloader(), b.val_dataloader(), strict=True):
        assert_same_batch(x, y, "waveform")


def test_crop_starts_are_uniform_as_the_per_clip_draws():
    """start = r mod (L - n + 1), r uniform on 62 bits: uniform on {0..L-n}, as the
    DataLoader path's torch.randint(L - n + 1); chi-square over 40 000 draws (df 100:
    mean 100, sd 14)."""
    crop = BatchAudioCrop(50)
    draws, _ = crop.draw(40_000, torch.Generator().manual_seed(1))
    lengths = torch.full((40_000,), 150)
    starts = crop.starts(lengths, draws)
    counts = torch.bincount(starts, minlength=101).double()
    assert counts.numel() == 101
    chi2 = float(((counts - 400) ** 2 / 400).sum())
    assert chi2 < 100 + 6 * math.sqrt(200), chi2
    short = crop.starts(torch.tensor([50, 20, 51]), torch.tensor([7, 9, 3]))
    assert short.tolist() == [0, 0, 1]  # not longer than n: whole; L = n + 1: two starts


def test_a_position_resumes_the_held_epoch_exactly(tmp_path):
    """Three batches into epoch 2, the module's state (the checkpoint's) resumes a new
    module with the remaining batches, crops included."""
    root = wav_folder(tmp_path, per_class=8)
    kw = {"n_mels": 16, "batch_size": 2, "val_size": 0, "test_size": 0, "clip_seconds": 0.3,
          "device_resident": True}
    data = AudioClassificationDataModule(train=root, **kw)
    data.setup("fit")
    loader = data.train_dataloader()
    whole = epoch(loader, 2)
    loader.sampler.set_epoch(2)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = data.state_dict()
    again = AudioClassificationDataModule(train=root, **kw)
    again.setup("fit")
    again.load_state_dict(state)
    rest = epoch(again.train_dataloader(), 2)
    assert len(rest) == len(whole) - 3
    for x, y in zip(whole[3:], rest, strict=True):
        assert all(torch.equal(x[k], y[k]) for k in x)


def test_resident_fit_resumes_mid_epoch_exactly(tmp_path):
    """A fit on held clips killed after step 5 and resumed from its checkpoint trains on
    the batches of the uninterrupted fit and ends with its weights."""
    from multimodal.models.audio import AudioClassifier, AudioClassifierConfig
    from multimodal.tasks import ClassificationTask
    from tests.resume_runs import assert_same_run, fit, interrupted

    root = wav_folder(tmp_path / "clips", per_class=6)

    def make():
        model = AudioClassifier(AudioClassifierConfig(num_classes=2, n_mels=16, dim=16,
                                                      depth=1, heads=2, mlp_dim=32))
        data = AudioClassificationDataModule(train=root, n_mels=16, batch_size=3, val_size=0,
                                             test_size=0, clip_seconds=0.3,
                                             device_resident=True)
        return ClassificationTask(model=model, optimizer={"lr": 3e-3}), data

    whole, record = fit(make, tmp_path / "whole", epochs=2, limit_val_batches=0)
    resumed, seen = interrupted(make, tmp_path / "cut", epochs=2, kills=[5],
                                limit_val_batches=0)
    assert [s for _, s, _ in seen] == list(range(8))
    assert seen == record.seen
    assert_same_run(whole, resumed)


def test_auto_holds_on_an_accelerator_and_says_so_else_refuses_clearly(tmp_path, caplog):
    from tests.data.test_device_batches import _Trainer

    caplog.set_level(logging.INFO)
    root = wav_folder(tmp_path)
    data = AudioClassificationDataModule(train=root, n_mels=16, batch_size=3)
    data.setup("fit")
    assert isinstance(data.train_dataloader(), ResumableDataLoader)  # CPU: the DataLoader
    # bytes held: per split, clips x (4 bytes x the widest clip + an int64 length and label),
    # the clips' 16 kHz lengths decoded here by the DataLoader path
    widest = {split: max(data.split_dataset(split).waveform(i).shape[0]
                         for i in range(len(data.split_dataset(split))))
              for split in ("train", "val", "test")}
    sizes = {split: len(data.split_dataset(split)) for split in widest}
    expected = sum(sizes[k] * (4 * widest[k] + 16) for k in widest)
    assert data.resident_bytes() == expected
    data.trainer = _Trainer("meta")
    assert data.resident_device() == torch.device("meta")
    assert (f"device-resident data: the splits ({expected / 2**20:.1f} MiB) are held on meta"
            in caplog.text)
    small = AudioClassificationDataModule(train=root, n_mels=16, device_resident_max_mb=0.01)
    small.trainer = _Trainer("meta")
    assert small.resident_device() is None
    assert "over device_resident_max_mb 0.01" in caplog.text
    noisy = AudioClassificationDataModule(train=root, n_mels=16, noise="white",
                                          device_resident=True)
    noisy.setup("fit")
    with pytest.raises(ValueError, match="device_resident=true: noise is mixed clip by clip"):
        noisy.train_dataloader()
    off = AudioClassificationDataModule(train=root, n_mels=16, device_resident="off")
    off.trainer = _Trainer("meta")
    assert off.resident_device() is None


def _gloo_rank(rank: int, world: int, port: int, root: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        data = AudioClassificationDataModule(train=root, n_mels=16, batch_size=2, val_size=2,
                                             test_size=0, features=False,
                                             device_resident=True)
        data.setup("fit")
        loader = data.train_dataloader()
        mine = {"n": len(loader),
                "lengths": torch.cat([b["lengths"] for b in epoch(loader, 1)]).tolist(),
                "val": torch.cat([b["lengths"] for b in data.val_dataloader()]).tolist()}
        shares: list = [None] * world
        dist.all_gather_object(shares, mine)
        if rank == 0:
            torch.save(shares, out)
    finally:
        dist.destroy_process_group()


def test_gloo_ranks_take_slices_of_one_permutation(tmp_path):
    """Two processes with a gloo group: each rank's held training batches are its slice of
    the shared epoch permutation, together the epoch, each clip once; the validation clips
    are shared out without repeats."""
    import socket

    import torch.multiprocessing as mp

    root = wav_folder(tmp_path / "clips", per_class=5)  # 10 clips: 8 train, 2 val
    reference = AudioClassificationDataModule(train=root, n_mels=16, batch_size=2, val_size=2,
                                              test_size=0, features=False,
                                              device_resident=False)
    reference.setup("fit")
    train = reference.split_dataset("train")
    lengths = [train.waveform(i).shape[0] for i in range(len(train))]
    assert len(set(lengths)) == len(lengths) == 8  # every clip told apart by its length
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "shares.pt")
    mp.start_processes(_gloo_rank, args=(2, port, root, out), nprocs=2, start_method="fork")
    shares = torch.load(out)
    sampler = EpochShuffleSampler(8, 0)
    sampler.set_epoch(1)
    order = [lengths[i] for i in sampler]
    assert [s["n"] for s in shares] == [2, 2]
    assert shares[0]["lengths"] == order[0::2] and shares[1]["lengths"] == order[1::2]
    assert Counter(shares[0]["lengths"] + shares[1]["lengths"]) == Counter(lengths)
    val = [int(n) for b in reference.val_dataloader() for n in b["lengths"]]
    assert sorted(shares[0]["val"] + shares[1]["val"]) == sorted(val)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_held_on_cuda_the_batches_are_the_cpu_ones(tmp_path):
    """The same seed gives the same cropped waveforms on the GPU as on the CPU (the order
    and the draws come from the host generator, the gather is exact) and log-mel features
    equal to float rounding."""
    for features in (False, True):
        data = AudioClassificationDataModule(train=wav_folder(tmp_path / str(features)),
                                             n_mels=16, batch_size=3, clip_seconds=0.3,
                                             features=features, device_resident=True)
        data.setup("fit")
        held = data.resident_split("train")
        cpu = data.train_dataloader()
        gpu = DeviceBatches([a.cuda() for a in held.arrays], 3, shuffle=True,
                            transform=held.transform, assemble=held.assemble)
        key = "features" if features else "waveform"
        for x, y in zip(epoch(cpu, 1), epoch(gpu, 1), strict=True):
            assert y[key].is_cuda and torch.equal(x["lengths"], y["lengths"].cpu())
            torch.testing.assert_close(x[key], y[key].cpu(), atol=1e-4, rtol=1e-4)
