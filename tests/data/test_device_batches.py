"""Device-resident splits (#50, item 2): batches taken on the device from the split held
there whole, against the per-item DataLoader path (torchvision-style per-sample
transforms). Run with device="cpu" here; the code is the same on an accelerator."""

from __future__ import annotations

import math
from collections import Counter

import lightning as L
import pytest
import torch

from multimodal.data.batch_augment import BatchImageTransform, shift_flip
from multimodal.data.device_batches import DeviceBatches, resident_setting
from multimodal.data.pixels import PixelDataModule
from multimodal.data.readers import CorruptFileError
from multimodal.data.sampling import EpochShuffleSampler, ResumableDataLoader
from multimodal.data.vision import ImageClassificationDataModule
from multimodal.data.vision_transforms import ShiftFlip

# ------------------------------------------------------------------ batched transforms


def _shift_reference(image: torch.Tensor, flip: bool, dy: int, dx: int) -> torch.Tensor:
    """out[y, x] = f[y - dy, x - dx] (0 outside), f the image mirrored when ``flip``:
    written out pixel by pixel."""
    _, h, w = image.shape
    out = torch.zeros_like(image)
    for y in range(h):
        for x in range(w):
            sy, sx = y - dy, x - dx
            if 0 <= sy < h and 0 <= sx < w:
                out[:, y, x] = image[:, sy, w - 1 - sx] if flip else image[:, sy, sx]
    return out


def test_shift_flip_is_the_formula_pixel_by_pixel():
    gen = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (6, 2, 5, 7), dtype=torch.uint8, generator=gen)
    flips = torch.tensor([False, True, False, True, True, False])
    offsets = torch.tensor([[0, 0], [0, 0], [2, -1], [-2, 2], [1, 1], [-2, -2]])
    out = shift_flip(images, flips, offsets, pad=2)
    for i in range(6):
        dy, dx = offsets[i].tolist()
        assert torch.equal(out[i], _shift_reference(images[i], bool(flips[i]), dy, dx)), i


@pytest.mark.parametrize(("pad", "flip"), [(3, True), (3, False), (0, True)])
def test_batched_shift_flip_gives_the_per_item_images_for_the_same_draws(pad, flip):
    """ShiftFlip (the per-item transform) draws flip then (dy, dx) from the global
    generator; replaying its draws into the batched transform gives its images bit for bit."""
    gen = torch.Generator().manual_seed(2)
    images = torch.randint(0, 256, (40, 3, 12, 12), dtype=torch.uint8, generator=gen)
    per_item, flips, offsets = [], [], []
    for i in range(len(images)):
        torch.manual_seed(100 + i)
        per_item.append(ShiftFlip(pad, flip)(images[i]))
        torch.manual_seed(100 + i)  # the same draws, in ShiftFlip's order
        flips.append(bool(torch.rand(()) < 0.5) if flip else False)
        offsets.append(torch.randint(-pad, pad + 1, (2,)) if pad else torch.zeros(2).long())
    batched = BatchImageTransform(pad, flip)(images, torch.tensor(flips), torch.stack(offsets))
    assert torch.equal(batched, torch.stack(per_item))


def test_the_draws_have_the_per_item_distribution():
    """flip ~ Bernoulli(1/2), (dy, dx) uniform on {-pad..pad}^2, independent: chi-square
    of the 2 x 9 x 9 cells against the uniform law (df = 161; mean 161, sd 18)."""
    pad, n = 4, 162_000
    flips, offsets = BatchImageTransform(pad, True).draw(n, torch.Generator().manual_seed(3))
    cell = flips.long() * 81 + (offsets[:, 0] + pad) * 9 + (offsets[:, 1] + pad)
    counts = torch.bincount(cell, minlength=162).double()
    assert counts.numel() == 162
    expected = n / 162
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 161 + 6 * math.sqrt(2 * 161), chi2


def test_augmented_images_have_the_per_item_statistics():
    """One image augmented 3000 times per item (ShiftFlip) and in a batch: the mean image
    and the fraction of zero-filled pixels agree within sampling error."""
    gen = torch.Generator().manual_seed(4)
    image = torch.randint(1, 256, (1, 8, 8), dtype=torch.uint8, generator=gen)
    n, pad = 3000, 2
    torch.manual_seed(5)
    per_item = torch.stack([ShiftFlip(pad, True)(image) for _ in range(n)]).double()
    transform = BatchImageTransform(pad, True)
    batched = transform(image.expand(n, 1, 8, 8),
                        *transform.draw(n, torch.Generator().manual_seed(6))).double()
    se = torch.sqrt((per_item.var(0) + batched.var(0)) / n).clamp_min(1.0)
    assert ((per_item.mean(0) - batched.mean(0)).abs() / se).max() < 5
    zeros_a, zeros_b = (per_item == 0).double().mean(0), (batched == 0).double().mean(0)
    p = (zeros_a + zeros_b) / 2
    assert ((zeros_a - zeros_b).abs() <= 5 * torch.sqrt(2 * p * (1 - p) / n) + 1e-9).all()


# ------------------------------------------------------------------ the loader


def test_train_order_is_the_epoch_shuffle_samplers_and_ranks_share_it():
    n, world = 37, 3
    ids = torch.arange(n)
    loaders = [DeviceBatches([ids], 4, shuffle=True, seed=7, world=world, rank=r)
               for r in range(world)]
    for loader in loaders:
        loader.sampler.set_epoch(2)
    assert len({len(loader) for loader in loaders}) == 1  # the ranks step together
    got = [torch.cat([b[0] for b in loader]) for loader in loaders]
    sampler = EpochShuffleSampler(n, 7)
    sampler.set_epoch(2)
    order = list(sampler)
    padded = order + order[: -(-n // world) * world - n]
    for r in range(world):
        assert got[r].tolist() == padded[r::world]
    union = Counter(torch.cat(got).tolist())
    assert set(union) == set(range(n)) and sum(union.values()) == len(padded)


def test_eval_order_is_in_order_and_each_item_once_over_ranks():
    n = 23
    loaders = [DeviceBatches([torch.arange(n)], 5, shuffle=False, world=2, rank=r)
               for r in range(2)]
    got = [torch.cat([b[0] for b in loader]).tolist() for loader in loaders]
    assert got == [list(range(0, n, 2)), list(range(1, n, 2))]


def test_resident_setting_spellings():
    assert resident_setting(True) == "true" and resident_setting("off") == "false"
    assert resident_setting("AUTO") == "auto"
    with pytest.raises(ValueError, match="device_resident must be"):
        resident_setting("sometimes")


def _pairs(loader, epoch):
    loader.sampler.set_epoch(epoch)
    return list(loader)


@pytest.mark.parametrize("image_size", [None, 10])
def test_resident_batches_are_the_dataloader_batches(image_size):
    """No augmentation: the same batches, bit for bit, as the DataLoader path (the same
    epoch permutation, the same resize, the same normalisation), in every split."""
    kw = dict(batch_size=16, val_size=32, augment=False, image_size=image_size)
    a = ImageClassificationDataModule("digits", device_resident=False, **kw)
    b = ImageClassificationDataModule("digits", device_resident=True, **kw)
    a.setup("fit"), b.setup("fit")
    assert isinstance(a.train_dataloader(), ResumableDataLoader)
    assert isinstance(b.train_dataloader(), DeviceBatches)
    for split in ("train", "val", "test"):  # how tasks and callbacks count examples
        made = getattr(b, f"{split}_dataloader")()
        assert len(made.dataset) == len(getattr(a, f"{split}_dataloader")().dataset)
    for epoch in (0, 1):
        xa = _pairs(a.train_dataloader(), epoch)
        xb = _pairs(b.train_dataloader(), epoch)
        assert len(xa) == len(xb)
        for (ia, la), (ib, lb) in zip(xa, xb, strict=True):
            assert torch.equal(ia, ib) and torch.equal(la, lb)
    for split in ("val", "test"):
        got_a = list(getattr(a, f"{split}_dataloader")())
        got_b = list(getattr(b, f"{split}_dataloader")())
        for (ia, la), (ib, lb) in zip(got_a, got_b, strict=True):
            assert torch.equal(ia, ib) and torch.equal(la, lb)


def test_augmented_resident_epoch_has_each_image_once_in_the_same_order():
    kw = dict(batch_size=16, val_size=32, augment=True, flip=True)
    a = ImageClassificationDataModule("digits", device_resident=False, **kw)
    b = ImageClassificationDataModule("digits", device_resident=True, **kw)
    a.setup("fit"), b.setup("fit")
    la = torch.cat([y for _, y in _pairs(a.train_dataloader(), 3)])
    xb = _pairs(b.train_dataloader(), 3)
    assert torch.equal(la, torch.cat([y for _, y in xb]))
    # the augmented images are shifted copies: the unshifted ones equal the DataLoader's
    # normalised originals (digits are 8x8: pad 1)
    assert xb[0][0].shape == (16, 1, 8, 8) and xb[0][0].dtype == torch.float32


def test_pixels_resident_batches_are_the_raw_uint8_batches():
    kw = dict(batch_size=32, val_size=64, limit_eval=50)
    a, b = PixelDataModule("digits", device_resident=False, **kw), \
        PixelDataModule("digits", device_resident=True, **kw)
    a.setup("fit"), b.setup("fit")
    for (ia, la), (ib, lb) in zip(_pairs(a.train_dataloader(), 1), _pairs(b.train_dataloader(), 1),
                                  strict=True):
        assert ib.dtype == torch.uint8 and torch.equal(ia, ib) and torch.equal(la, lb)
    for (ia, _), (ib, _) in zip(a.val_dataloader(), b.val_dataloader(), strict=True):
        assert torch.equal(ia, ib)


class _Strategy:
    def __init__(self, device: str) -> None:
        self.root_device = torch.device(device)


class _Trainer:
    def __init__(self, device: str) -> None:
        self.strategy, self.world_size, self.global_rank = _Strategy(device), 1, 0


def test_auto_holds_the_data_on_an_accelerator_only_and_under_the_limit(caplog):
    import logging

    caplog.set_level(logging.INFO)
    data = ImageClassificationDataModule("digits", batch_size=16, val_size=32)
    data.setup("fit")
    assert isinstance(data.train_dataloader(), ResumableDataLoader)  # CPU: today's path
    assert "device-resident" not in caplog.text
    data.trainer = _Trainer("meta")  # an accelerator (no memory needed to decide)
    assert data.resident_device() == torch.device("meta")
    data.resident_device()
    assert caplog.text.count("device-resident data: the splits (0.1 MiB) are held on meta") == 1
    small = ImageClassificationDataModule("digits", batch_size=16, val_size=32,
                                          device_resident_max_mb=0.01)
    small.setup("fit")
    small.trainer = _Trainer("meta")
    assert small.resident_device() is None  # 0.1 MiB > 0.01 MiB
    assert "not used, the splits take 0.1 MiB, over device_resident_max_mb 0.01" in caplog.text
    off = ImageClassificationDataModule("digits", batch_size=16, device_resident=False)
    off.trainer = _Trainer("meta")
    assert off.resident_device() is None


def _image_folder(root, n=6, size=(9, 11)):
    """Two classes of ``n`` RGB PNGs each, of size ``size`` (not the model's)."""
    from torchvision.io import write_png

    gen = torch.Generator().manual_seed(8)
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(n):
            image = torch.randint(0, 256, (3, *size), dtype=torch.uint8, generator=gen)
            write_png(image, str(root / c / f"{i}.png"))
    return str(root)


def test_true_where_the_data_cannot_be_held_is_an_error(tmp_path):
    data = ImageClassificationDataModule(train=_image_folder(tmp_path), image_size=8,
                                         val_size=0, test_size=0, auto_augment="trivial",
                                         device_resident=True)
    data.setup("fit")
    with pytest.raises(ValueError, match="device_resident=true: random_resized_crop"):
        data.train_dataloader()


@pytest.mark.parametrize("resize", [None, 10])
def test_your_image_files_decoded_once_give_the_dataloader_batches(tmp_path, resize):
    """Your files, decoded and resized once (plain, or shorter side + centre crop): the
    DataLoader path's normalised images bit for bit, in every split."""
    kw = dict(train=_image_folder(tmp_path), image_size=8, val_size=2, test_size=2,
              batch_size=4, augment=False, resize=resize)
    a = ImageClassificationDataModule(device_resident=False, **kw)
    b = ImageClassificationDataModule(device_resident=True, **kw)
    a.setup("fit"), b.setup("fit")
    assert b.resident_bytes() == 12 * (3 * 8 * 8 + 8)
    got = list(zip(_pairs(a.train_dataloader(), 1), _pairs(b.train_dataloader(), 1),
                   strict=True))
    got += list(zip(a.val_dataloader(), b.val_dataloader(), strict=True))
    got += list(zip(a.test_dataloader(), b.test_dataloader(), strict=True))
    for (xa, ya), (xb, yb) in got:
        assert torch.equal(ya, yb) and torch.equal(xa, xb)


def test_a_corrupt_file_is_skipped_once_when_asked(tmp_path, caplog):
    root = _image_folder(tmp_path)
    (tmp_path / "a" / "9.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    kw = dict(train=root, image_size=8, val_size=0, test_size=0, batch_size=4,
              device_resident=True)
    data = ImageClassificationDataModule(skip_corrupt=True, verify_files=False, **kw)
    data.setup("fit")  # the resident decode's own skipping (verify_files would leave it out)
    assert sum(len(y) for _, y in data.train_dataloader()) == 12
    assert "skipped 1 corrupt image file(s) of 13" in caplog.text
    strict = ImageClassificationDataModule(**kw)
    with pytest.raises(CorruptFileError, match=r"9\.png"):
        strict.setup("fit")  # the statistics read it first, as on the DataLoader path
        strict.train_dataloader()


# ------------------------------------------------------------------ through Lightning


def test_resident_fit_resumes_mid_epoch_exactly(tmp_path):
    """A fit on held data killed after steps 7 and 12 and resumed from their checkpoints
    trains on the batches of the uninterrupted fit (shifts and flips included) and ends
    with its weights, bit for bit; the loader Lightning got is the resident one."""
    import multimodal as mm
    from multimodal.tasks import ClassificationTask
    from tests.resume_runs import assert_each_once_per_epoch, assert_same_run, fit, interrupted

    loaders = []

    def make():
        task = ClassificationTask(mm.ViT(mm.ViTConfig(
            image_size=8, patch_size=2, in_channels=1, num_classes=10, dim=32, depth=2,
            heads=4, mlp_dim=64, pool="mean")), optimizer={"lr": 3e-3})
        data = ImageClassificationDataModule("digits", batch_size=16, val_size=32,
                                             limit_train=80, augment=True, flip=True,
                                             device_resident=True)
        original = data.train_dataloader

        def train_dataloader():
            loaders.append(original())
            return loaders[-1]
        data.train_dataloader = train_dataloader
        return task, data

    whole, record = fit(make, tmp_path / "whole", epochs=3)
    resumed, seen = interrupted(make, tmp_path / "cut", epochs=3, kills=[7, 12])
    assert all(isinstance(loader, DeviceBatches) for loader in loaders)
    assert [s for _, s, _ in seen] == list(range(15))
    assert seen == record.seen
    assert_each_once_per_epoch(seen, 80)
    assert_same_run(whole, resumed)


class _RecordRank(L.Callback):
    """Writes each rank's training example ids (epoch, loader type, ids), one batch a line."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        from tests.resume_runs import example_ids

        loader = type(trainer.train_dataloader).__name__
        with open(f"{self.folder}/rank{trainer.global_rank}.txt", "a") as f:
            f.write(f"{trainer.current_epoch} {loader} {' '.join(example_ids(batch))}\n")


def _gloo_rank(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from tests.resume_runs import example_ids

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        data = ImageClassificationDataModule("digits", batch_size=16, val_size=32,
                                             limit_train=69, augment=True,
                                             device_resident=True)
        data.setup("fit")
        loader = data.train_dataloader()
        loader.sampler.set_epoch(1)
        labels = [y for _, y in loader]
        mine = {"n": len(loader), "labels": torch.cat(labels).tolist(),
                "val": [i for b in data.val_dataloader() for i in example_ids(b)]}
        shares: list = [None] * world
        dist.all_gather_object(shares, mine)
        if rank == 0:
            torch.save(shares, out)
    finally:
        dist.destroy_process_group()


def test_gloo_ranks_take_slices_of_one_permutation(tmp_path):
    """Two processes with a gloo group, no Lightning: each rank's held training batches are
    its slice of the shared epoch permutation (69 images: padded to 70 by repeating the
    head), and the validation split is shared out without repeats."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "shares.pt")
    mp.start_processes(_gloo_rank, args=(2, port, out), nprocs=2, start_method="fork")
    shares = torch.load(out)
    reference = ImageClassificationDataModule("digits", batch_size=16, val_size=32,
                                              limit_train=69, device_resident=False)
    reference.setup("fit")
    sampler = EpochShuffleSampler(69, 0)
    sampler.set_epoch(1)
    order = list(sampler)
    labels = reference._load_splits()["train"].labels
    padded = [int(labels[i]) for i in order + order[:1]]
    assert [s["n"] for s in shares] == [3, 3]
    assert shares[0]["labels"] == padded[0::2] and shares[1]["labels"] == padded[1::2]
    from tests.resume_runs import example_ids

    val = [i for b in reference.val_dataloader() for i in example_ids(b)]
    assert sorted(shares[0]["val"] + shares[1]["val"]) == sorted(val)  # each once


@pytest.mark.slow  # ~50 s on 2 busy cores (two spawned processes)
def test_ddp_ranks_take_slices_of_one_permutation(tmp_path):
    """Two CPU processes (gloo): each rank's held batches are its own share of the shared
    permutation, and together they are the epoch, each training image once."""
    import multimodal as mm
    from multimodal.tasks import ClassificationTask
    from tests.resume_runs import example_ids

    kw = dict(batch_size=16, val_size=32, limit_train=80, augment=False)
    reference = ImageClassificationDataModule("digits", device_resident=False, **kw)
    reference.setup("fit")
    expected = Counter(i for batch in reference.train_dataloader() for i in example_ids(batch))
    assert sum(expected.values()) == 80
    task = ClassificationTask(mm.ViT(mm.ViTConfig(
        image_size=8, patch_size=2, in_channels=1, num_classes=10, dim=16, depth=1, heads=2,
        mlp_dim=32, pool="mean")))
    data = ImageClassificationDataModule("digits", device_resident=True, **kw)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=2,
                        limit_val_batches=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path,
                        callbacks=[_RecordRank(str(tmp_path))])
    trainer.fit(task, data)
    by_epoch: dict[int, list[list[str]]] = {}
    for rank in (0, 1):
        rows = [line.split() for line in (tmp_path / f"rank{rank}.txt").read_text().splitlines()]
        assert {row[1] for row in rows} == {"DeviceBatches"}
        for epoch in (0, 1):
            by_epoch.setdefault(epoch, []).append(
                [i for row in rows if int(row[0]) == epoch for i in row[2:]])
    for epoch, shares in by_epoch.items():
        assert [len(s) for s in shares] == [40, 40], epoch
        assert Counter(shares[0] + shares[1]) == expected, epoch
    assert by_epoch[0][0] != by_epoch[1][0]  # a new permutation each epoch


def test_resident_scene_batches_are_the_dataloader_batches():
    """Captions: the same normalised images and the same caption strings, in every split."""
    from multimodal.data.captions import CaptionDataModule

    kw = dict(num_train=40, num_val=12, num_test=12, image_size=16, batch_size=8)
    a = CaptionDataModule("scenes", device_resident=False, **kw)
    b = CaptionDataModule("scenes", device_resident=True, **kw)
    a.setup("fit"), b.setup("fit")
    assert isinstance(b.train_dataloader(), DeviceBatches)
    pairs = list(zip(_pairs(a.train_dataloader(), 2), _pairs(b.train_dataloader(), 2),
                     strict=True))
    pairs += list(zip(a.val_dataloader(), b.val_dataloader(), strict=True))
    for x, y in pairs:
        assert x["captions"] == y["captions"]
        assert torch.equal(x["images"], y["images"])


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_held_on_cuda_the_batches_are_the_cpu_ones():
    """The same seed gives the same augmented, normalised batches on the GPU as on the CPU
    (the order and the draws come from the host generator; the pixel maths is exact)."""
    data = ImageClassificationDataModule("digits", batch_size=32, val_size=32, augment=True,
                                         flip=True, device_resident=True)
    data.setup("fit")
    cpu = data.train_dataloader()
    held = data.resident_split("train")
    gpu = DeviceBatches([a.cuda() for a in held.arrays], 32, shuffle=True,
                        transform=held.transform.to("cuda"))
    for (xa, ya), (xb, yb) in zip(_pairs(cpu, 1), _pairs(gpu, 1), strict=True):
        assert xb.is_cuda and torch.equal(xa, xb.cpu()) and torch.equal(ya, yb.cpu())


@cuda
def test_auto_holds_the_data_on_the_gpu_in_a_fit(tmp_path):
    import multimodal as mm
    from multimodal.tasks import ClassificationTask

    task = ClassificationTask(mm.ViT(mm.ViTConfig(
        image_size=8, patch_size=2, in_channels=1, num_classes=10, dim=16, depth=1, heads=2,
        mlp_dim=32, pool="mean")))
    data = ImageClassificationDataModule("digits", batch_size=32, val_size=64)
    trainer = L.Trainer(accelerator="gpu", devices=1, max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(task, data)
    assert isinstance(trainer.train_dataloader, DeviceBatches)
    assert trainer.train_dataloader.device.type == "cuda"


def test_a_position_saved_on_one_path_resumes_on_the_other():
    """The position in the epoch means the same on both paths (the same permutation): a run
    checkpointed with the DataLoader (say on a CPU) resumes held on the device with the
    batches it had not trained on, and the other way round."""
    kw = dict(batch_size=16, val_size=32, limit_train=100, augment=False)
    runs = {}
    for held in (False, True):
        data = ImageClassificationDataModule("digits", device_resident=held, **kw)
        data.setup("fit")
        runs[held] = data
    for saved, resumed in ((False, True), (True, False)):
        loader = runs[saved].train_dataloader()
        loader.sampler.set_epoch(2)
        whole = list(loader)
        loader.sampler.set_epoch(2)
        it = iter(loader)
        for _ in range(3):
            next(it)
        state = runs[saved].state_dict()
        again = ImageClassificationDataModule("digits", device_resident=resumed, **kw)
        again.setup("fit")
        again.load_state_dict(state)
        rest = _pairs(again.train_dataloader(), 2)
        assert len(rest) == len(whole) - 3
        for (xa, ya), (xb, yb) in zip(whole[3:], rest, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_ranks_share_the_epoch_unless_lightning_is_told_not_to():
    """Trainer(use_distributed_sampler=False) gives every rank the whole split on the
    DataLoader path; held data do the same."""
    from types import SimpleNamespace

    data = ImageClassificationDataModule("digits", batch_size=16, val_size=32,
                                         limit_train=40, device_resident=True)
    data.setup("fit")
    data.trainer = SimpleNamespace(strategy=_Strategy("cpu"), world_size=2, global_rank=1,
                                   _accelerator_connector=SimpleNamespace(
                                       use_distributed_sampler=True))
    assert data.train_dataloader().items_per_rank == 20
    data.trainer._accelerator_connector.use_distributed_sampler = False
    assert data.train_dataloader().items_per_rank == 40
