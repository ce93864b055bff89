"""Training switches that matter at scale, exercised on CPU: torch.compile, activation
checkpointing and bf16 mixed precision."""

from __future__ import annotations

import shutil
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F

import multimodal as mm
from multimodal.data.vision import ImageClassificationDataModule
from multimodal.tasks import ClassificationTask

DIGITS_VIT = dict(image_size=8, patch_size=2, in_channels=1, num_classes=10, dim=32, depth=2,
                  heads=4, mlp_dim=64, pool="mean")


def _fast_dev_run(tmp_path: Path, task: ClassificationTask, **kw) -> L.Trainer:
    trainer = L.Trainer(accelerator="cpu", fast_dev_run=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path, **kw)
    dm = ImageClassificationDataModule("digits", batch_size=16, val_size=0.1, augment=False)
    trainer.fit(task, dm)
    return trainer


def _record_head_dtypes(model: mm.ViT) -> list[torch.dtype]:
    seen: list[torch.dtype] = []
    model.head.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    return seen


def _has_compiler() -> bool:
    return shutil.which("cc") is not None or shutil.which("gcc") is not None


@pytest.mark.slow
@pytest.mark.skipif(not _has_compiler(), reason="torch.compile on CPU needs a C compiler")
def test_compile_switch_runs_and_matches_eager(tmp_path):
    L.seed_everything(0)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = mm.ViT(mm.ViTConfig(**DIGITS_VIT))
    task = ClassificationTask(model, compile=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _fast_dev_run(tmp_path, task)
    assert torch._dynamo.utils.counters["frames"]["ok"] > 0  # dynamo did compile a frame
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    x = torch.randn(4, 1, 8, 8)
    model.eval()
    with torch.no_grad():  # model.forward bypasses the compiled __call__: the eager path
        torch.testing.assert_close(task(x), model.forward(x), atol=1e-5, rtol=1e-5)


def test_every_task_takes_the_compile_switch():
    import inspect

    from multimodal import tasks

    names = [n for n in tasks.__all__ if n.endswith("Task") and n != "ModelTask"]
    assert len(names) >= 7
    for name in names:
        cls = getattr(tasks, name)  # a ModelTask's is ModelTask's, reached through **kwargs
        owner = tasks.ModelTask if issubclass(cls, tasks.ModelTask) else cls
        params = inspect.signature(owner.__init__).parameters
        assert "compile" in params and params["compile"].default is False, name


def test_compiled_task_checkpoints_have_the_eager_parameter_names():
    eager = ClassificationTask(mm.ViT(mm.ViTConfig(**DIGITS_VIT)))
    compiled = ClassificationTask(mm.ViT(mm.ViTConfig(**DIGITS_VIT)), compile=True)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    assert all(k.startswith("model.") for k in eager.state_dict())
    # A compiled run's checkpoint loads into an eager task, and back.
    compiled.load_state_dict(eager.state_dict())
    eager.load_state_dict(compiled.state_dict())


def test_old_checkpoints_with_a_second_copy_of_the_weights_still_load():
    source = ClassificationTask(mm.ViT(mm.ViTConfig(**DIGITS_VIT)))
    state = source.state_dict()
    legacy = {**state, **{"_forward." + k[len("model."):]: v for k, v in state.items()}}
    checkpoint = {"state_dict": legacy}
    target = ClassificationTask(mm.ViT(mm.ViTConfig(**DIGITS_VIT)))
    target.on_load_checkpoint(checkpoint)
    target.load_state_dict(checkpoint["state_dict"])  # strict: no unexpected keys left
    for k, v in target.state_dict().items():
        torch.testing.assert_close(v, state[k])


def _grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    return {k: p.grad.clone() for k, p in model.named_parameters()}


def test_activation_checkpointing_gives_the_same_gradients(tmp_path):
    torch.manual_seed(0)
    plain = mm.ViT(mm.ViTConfig(**DIGITS_VIT, dropout=0.0))
    ckpt = mm.ViT(mm.ViTConfig(**DIGITS_VIT, dropout=0.0, checkpoint_activations=True))
    ckpt.load_state_dict(plain.state_dict())
    plain.train()
    ckpt.train()
    # With checkpointing each Block starts twice per step: in forward, again in backward
    # (a pre-hook: the recomputation may stop early, before the Block returns).
    calls = {"plain": 0, "ckpt": 0}
    plain.transformer.blocks[0].register_forward_pre_hook(
        lambda *a: calls.__setitem__("plain", calls["plain"] + 1))
    ckpt.transformer.blocks[0].register_forward_pre_hook(
        lambda *a: calls.__setitem__("ckpt", calls["ckpt"] + 1))
    x, y = torch.randn(6, 1, 8, 8), torch.randint(0, 10, (6,))
    g_plain, g_ckpt = _grads(plain, x, y), _grads(ckpt, x, y)
    assert calls == {"plain": 1, "ckpt": 2}
    assert g_plain.keys() == g_ckpt.keys()
    for k in g_plain:
        torch.testing.assert_close(g_ckpt[k], g_plain[k], atol=1e-6, rtol=1e-5, msg=k)
    assert max(g.abs().max() for g in g_plain.values()) > 0

    # ... and it trains inside Lightning.
    before = {k: v.clone() for k, v in ckpt.state_dict().items()}
    _fast_dev_run(tmp_path, ClassificationTask(ckpt))
    assert any(not torch.equal(before[k], v) for k, v in ckpt.state_dict().items())


def test_bf16_mixed_precision_runs_on_cpu(tmp_path):
    L.seed_everything(0)
    model = mm.ViT(mm.ViTConfig(**DIGITS_VIT))
    seen = _record_head_dtypes(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = _fast_dev_run(tmp_path, ClassificationTask(model), precision="bf16-mixed")
    assert trainer.precision == "bf16-mixed"
    assert seen and all(d == torch.bfloat16 for d in seen)  # the matmuls ran in bf16
    for k, v in model.state_dict().items():  # master weights stay fp32 and moved
        assert v.dtype == before[k].dtype == torch.float32, k
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.isfinite(trainer.callback_metrics["train/loss"])


def _load_mfu_module():
    import importlib.util

    path = Path(__file__).parents[2] / "benchmarks" / "mfu.py"
    spec = importlib.util.spec_from_file_location("mfu_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_vit_b16_flop_count():
    """ViT-B/16 at 224 px: about 17.5 GMACs forward (the commonly quoted 17.6 G); torch's
    own FLOP counter (2 FLOPs per MAC) agrees with the analytic formula (checked on a small
    ViT of another shape, to stay fast; ``benchmarks/mfu.py --dry-run`` does ViT-B)."""
    mfu = _load_mfu_module()
    cfg = mm.ViTConfig(**mfu.VIT_B16)
    macs = mfu.vit_forward_macs(cfg)
    # by hand: 196 patches of 768 inputs; 12 layers of T=197 tokens; 1000-way head
    by_hand = 196 * 768 * 768 + 12 * (197 * 768 * (3 * 768 + 768 + 2 * 3072)
                                      + 2 * 197 * 197 * 768) + 768 * 1000
    assert macs == by_hand
    assert 17.4e9 < macs < 17.7e9
    small = mm.ViTConfig(image_size=(32, 48), patch_size=8, in_channels=1, num_classes=7,
                         dim=64, depth=3, heads=4, mlp_dim=96)
    assert abs(mfu.counted_forward_flops(small) / (2 * mfu.vit_forward_macs(small)) - 1) < 0.005


def test_mfu_fails_clearly_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(SystemExit, match="--dry-run"):
        _load_mfu_module().main(["--steps", "1"])
