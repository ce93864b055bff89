"""Contrastive losses against their formulas computed element by element, recall@k, and
DDP: 2 gloo ranks x batch B give the loss and gradients of one process with batch 2B."""

from __future__ import annotations

import math
import os
import socket

import pytest
import torch
import torch.nn.functional as F

import multimodal as mm
from multimodal.tasks.contrastive import clip_loss, gather_with_grad, recall_at_k, siglip_loss


def unit(n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=-1)


def test_clip_loss_is_the_symmetric_infonce_by_hand():
    img, txt, s = unit(5, 7, 0), unit(5, 7, 1), torch.tensor(1 / 0.07, dtype=torch.float64)
    n = 5
    total_i = total_t = 0.0
    for i in range(n):
        dots_i = [float(s) * sum(img[i, k] * txt[j, k] for k in range(7)) for j in range(n)]
        dots_t = [float(s) * sum(txt[i, k] * img[j, k] for k in range(7)) for j in range(n)]
        total_i += -dots_i[i] + math.log(sum(math.exp(v) for v in dots_i))
        total_t += -dots_t[i] + math.log(sum(math.exp(v) for v in dots_t))
    expected = (total_i / n + total_t / n) / 2
    got = clip_loss(img, txt, s)
    assert got.item() == pytest.approx(float(expected), rel=1e-6)


def test_siglip_loss_by_hand():
    img, txt = unit(4, 6, 2), unit(4, 6, 3)
    s, b = torch.tensor(10.0, dtype=torch.float64), torch.tensor(-10.0, dtype=torch.float64)
    total = 0.0
    for i in range(4):
        for j in range(4):
            z = 1.0 if i == j else -1.0
            logit = 10.0 * float(img[i] @ txt[j]) - 10.0
            total += -math.log(1 / (1 + math.exp(-z * logit)))
    assert siglip_loss(img, txt, s, b).item() == pytest.approx(total / 4, rel=1e-6)


def test_local_rows_against_global_columns_average_to_the_global_loss():
    img, txt, s = unit(6, 5, 4), unit(6, 5, 5), torch.tensor(12.0, dtype=torch.float64)
    halves = [clip_loss(img[r * 3:(r + 1) * 3], txt[r * 3:(r + 1) * 3], s, img, txt, r * 3)
              for r in range(2)]
    torch.testing.assert_close(sum(halves) / 2, clip_loss(img, txt, s))
    bias = torch.tensor(-3.0, dtype=torch.float64)
    halves = [siglip_loss(img[r * 3:(r + 1) * 3], txt[r * 3:(r + 1) * 3], s, bias, txt, r * 3)
              for r in range(2)]
    torch.testing.assert_close(sum(halves) / 2, siglip_loss(img, txt, s, bias))


def test_gather_without_a_process_group_is_the_identity():
    x = torch.randn(3, 4)
    out, offset = gather_with_grad(x)
    assert out is x and offset == 0


def test_recall_at_k_counts_any_correct_item_in_the_top_k():
    sim = torch.tensor([[0.9, 0.1, 0.5], [0.2, 0.3, 0.8], [0.7, 0.6, 0.1]])
    correct = torch.eye(3, dtype=torch.bool)
    # ranks of the right column: row 0 first, row 1 second, row 2 third
    assert recall_at_k(sim, correct, [1, 2, 3]) == pytest.approx({1: 1 / 3, 2: 2 / 3, 3: 1.0})
    correct[2, 0] = True  # a duplicate caption ranked first also counts
    assert recall_at_k(sim, correct, [1])[1] == pytest.approx(2 / 3)


# -- DDP -----------------------------------------------------------------------------------

VISION = dict(image_size=8, patch_size=4, in_channels=3, dim=16, depth=1, heads=2, mlp_dim=32,
              pool="mean", class_token=False)
TEXT = dict(vocab_size=20, max_len=8, dim=16, depth=1, heads=2, mlp_dim=32)


def _model(loss: str) -> mm.CLIP:
    torch.manual_seed(0)
    return mm.CLIP(mm.CLIPConfig(vision=mm.ViTConfig(**VISION), text=mm.TextEncoderConfig(**TEXT),
                                 embed_dim=8, loss=loss)).double()


def _data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return (torch.randn(n, 3, 8, 8, generator=g, dtype=torch.float64),
            torch.randint(7, 20, (n, 5), generator=g))


def _task_loss(model: mm.CLIP, images: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    from multimodal.tasks.contrastive import ContrastiveTask

    task = ContrastiveTask(model)
    return task.loss(*model.forward_features(images, ids).unbind(1))


def _rank(rank: int, port: int, loss: str, batch: int, folder: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        model = _model(loss)
        images, ids = _data(2 * batch)
        part = slice(rank * batch, (rank + 1) * batch)
        value = _task_loss(model, images[part], ids[part])
        value.backward()
        for p in model.parameters():  # what DDP does to the gradients: their mean over ranks
            dist.all_reduce(p.grad)
            p.grad /= 2
        torch.save({"loss": value.detach(), "grads": {k: p.grad for k, p in
                                                      model.named_parameters()}},
                   os.path.join(folder, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # two spawned processes: ~30 s each on the shared 2-core machine
@pytest.mark.parametrize("loss", ["softmax", "sigmoid"])
def test_two_ranks_of_batch_b_equal_one_process_of_batch_2b(tmp_path, loss):
    import torch.multiprocessing as mp

    batch = 3
    mp.spawn(_rank, args=(_free_port(), loss, batch, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]

    model = _model(loss)
    images, ids = _data(2 * batch)
    full = _task_loss(model, images, ids)
    full.backward()
    # each rank's loss is its rows against the global batch; their mean is the global loss
    torch.testing.assert_close((ranks[0]["loss"] + ranks[1]["loss"]) / 2, full.detach())
    assert not torch.allclose(ranks[0]["loss"], ranks[1]["loss"])
    for name, p in model.named_parameters():
        for r in ranks:
            torch.testing.assert_close(r["grads"][name], p.grad, msg=name)
    # without the gather each rank would see only its own 3 negatives: a different loss
    local = [_task_loss(_model(loss), images[r * 3:(r + 1) * 3], ids[r * 3:(r + 1) * 3])
             for r in range(2)]
    assert not torch.allclose((local[0] + local[1]) / 2, full.detach())


# -- the Lightning task ----------------------------------------------------------------------

def test_task_trains_on_scenes_logs_the_metrics_and_keeps_its_tokenizer(tmp_path):
    import lightning as L

    from multimodal.data.captions import CaptionDataModule
    from multimodal.loading import from_pretrained
    from multimodal.tasks.contrastive import ContrastiveTask

    L.seed_everything(0)
    model = mm.CLIP(mm.CLIPConfig(
        vision=mm.ViTConfig(image_size=16, patch_size=4, dim=16, depth=1, heads=2, mlp_dim=32,
                            pool="mean", class_token=False),
        text=mm.TextEncoderConfig(vocab_size=32, max_len=24, dim=16, depth=1, heads=2,
                                  mlp_dim=32), embed_dim=8))
    with torch.no_grad():
        model.logit_scale.fill_(math.log(100.0) - 1e-4)  # one step up would pass the cap
    dm = CaptionDataModule("scenes", image_size=16, num_train=64, num_val=32, num_test=32,
                           batch_size=16, order="left_to_right")
    task = ContrastiveTask(model, optimizer={"lr": 1e-2, "warmup_fraction": 0.0}, zero_shot_size=24,
                           recall_ks=(1, 5))
    trainer = L.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path,
                        limit_val_batches=2)
    trainer.fit(task, dm)
    m = trainer.callback_metrics
    for key in ("train/loss", "train/temperature", "val/loss", "val/i2t_R@1", "val/t2i_R@5",
                "val/zero_shot_heldout", "val/zero_shot_seen"):
        assert key in m, key
        assert torch.isfinite(m[key])
    assert 0.0 <= float(m["val/i2t_R@1"]) <= float(m["val/i2t_R@5"]) <= 1.0
    assert model.logit_scale.item() <= math.log(100.0)  # clamped after every step
    ckpt = next(tmp_path.rglob("*.ckpt"))
    again = ContrastiveTask(from_pretrained(ckpt))
    again.on_load_checkpoint(torch.load(ckpt, weights_only=True))
    assert again.tokenizer is not None
    assert again.tokenizer.encode("a small red circle") == task.tokenizer.encode(
        "a small red circle")


def test_zero_shot_sets_come_from_the_data_module(monkeypatch):
    """The task evaluates the zero-shot sets its data module supplies, under their names, and
    none when the data module supplies none (it knows no dataset by name)."""
    from multimodal.data.captions import CaptionDataModule
    from multimodal.tasks.contrastive import ContrastiveTask
    from multimodal.tokenizers.text import WordTokenizer

    odd = {"images": torch.zeros(2, 3, 8, 8), "labels": torch.tensor([0, 1]),
           "class_names": ["a", "b"]}

    class OwnSets:
        def zero_shot_sets(self, n: int) -> dict:
            return {"odd": {**odd, "n": n}}

    class NoSets:
        pass

    task = ContrastiveTask(_model("softmax").float(), zero_shot_size=7)
    task.tokenizer = WordTokenizer.train(["a b"], vocab_size=None)
    for dm, expected in ((OwnSets(), {"odd": {**odd, "n": 7}}), (NoSets(), {})):
        monkeypatch.setattr(ContrastiveTask, "datamodule", property(lambda self, dm=dm: dm))
        task._zero_shot = {}
        task.setup("fit")
        assert task._zero_shot == expected
    scenes = CaptionDataModule("scenes", image_size=16, num_train=8, num_val=4, num_test=4)
    sets = scenes.zero_shot_sets(6)
    assert sorted(sets) == ["heldout", "seen"]
    for data in sets.values():
        assert data["images"].shape == (6, 3, 16, 16) and data["labels"].shape == (6,)
        assert int(data["labels"].max()) < len(data["class_names"])


def test_zero_shot_sets_come_from_the_data_module_and_are_checked():
    from multimodal.data.captions import CaptionDataModule
    from multimodal.tasks.contrastive import zero_shot_sets_of

    dm = CaptionDataModule("scenes", image_size=16, num_train=64, num_val=8, num_test=8)
    sets = zero_shot_sets_of(dm, 10)
    assert sorted(sets) == ["heldout", "seen"]
    assert sets["heldout"]["images"].shape == (10, 3, 16, 16)
    assert zero_shot_sets_of(dm, 0) == {}
    assert zero_shot_sets_of(object(), 10) == {}  # a data module without the capability

    class Offers:
        def __init__(self, data):
            self.data = data

        def zero_shot_sets(self, n):
            return {"mine": self.data}

    good = {"images": torch.zeros(3, 3, 8, 8), "labels": torch.tensor([0, 1, 1]),
            "class_names": ["cat", "dog"]}
    assert zero_shot_sets_of(Offers(good), 3)["mine"] is good
    bad = [({**good, "class_names": []}, "class_names"),
           ({**good, "labels": torch.tensor([0, 1])}, "one label per image"),
           ({**good, "labels": torch.tensor([0, 1, 2])}, r"\[0, 2\)"),
           ({k: v for k, v in good.items() if k != "images"}, "lacks"),
           ({**good, "images": torch.zeros(3, 8, 8)}, "images")]
    for data, match in bad:
        with pytest.raises(ValueError, match=match):
            zero_shot_sets_of(Offers(data), 3)
