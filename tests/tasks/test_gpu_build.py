"""Every shipped config's task and trainer, built as a GPU run builds them (the fused
AdamW, the config's precision, its gradient clipping), take their first optimiser step
on this CPU: ``torch.optim.AdamW(fused=True)`` exists on CPU, and Lightning's refusal to
clip for a fused optimiser under mixed precision ("does not allow for gradient clipping
because it performs unscaling of gradients internally", issue 50) is the same on both."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from multimodal.tasks.base import ModelTask
from multimodal.tasks.optim import FUSED_ENV, adamw, clip_gradients, use_fused

ROOT = Path(__file__).parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
# Word2Vec steps its two tables itself (plain SGD, a fused index_add_ update: no AdamW, no
# clipping, nothing Lightning's mixed precision refuses); its config is checked apart
OWN_STEP = {"word2vec"}
ADAMW_CONFIGS = [p for p in CONFIGS if p.stem not in OWN_STEP]


@dataclasses.dataclass
class TinyConfig:
    dim: int = 6


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = TinyConfig()
        self.body = nn.Linear(6, 6)
        self.norm = nn.LayerNorm(6)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.body(x))


class StandIn(ModelTask):
    """ModelTask's optimiser and clipping (what every shipped task uses: checked below),
    a loss with large gradients so that clipping acts, and a record of the gradients
    before and after the clipping."""

    def __init__(self) -> None:
        super().__init__(Tiny())
        self.before: list[Tensor] = []
        self.after: list[Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return 1e3 * self.model(batch[0]).float().pow(2).mean()

    def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None,
                                    gradient_clip_algorithm: Any = None) -> None:
        self.before = [p.grad.detach().clone() for p in self.model.parameters()]
        super().configure_gradient_clipping(optimizer, gradient_clip_val,
                                            gradient_clip_algorithm)
        self.after = [p.grad.detach().clone() for p in self.model.parameters()]


def _trainer_settings(path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from tests.cli.test_configs import _parse

    return _parse(["fit", "--config", str(path)], monkeypatch)


def _gpu_precision(config: Any) -> str:
    """The precision the config runs with on a bf16 GPU (the CLI's auto rule there)."""
    from multimodal.cli.precision import auto_precision

    chosen = config.trainer.get("precision")
    if chosen is not None and str(chosen) != "auto":
        return str(chosen)
    return auto_precision(None, "gpu", cuda_bf16=True)[0]


@pytest.mark.parametrize("path", ADAMW_CONFIGS, ids=lambda p: p.stem)
def test_every_config_takes_its_first_step_with_a_fused_adamw_and_its_clipping(
        path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _trainer_settings(path, monkeypatch)
    monkeypatch.undo()
    # the stand-in is faithful: the config's task optimises and clips as ModelTask does
    from multimodal.cli.main import _class_of

    task_cls = _class_of(config.model.class_path)
    assert task_cls is not None and issubclass(task_cls, ModelTask)
    assert task_cls.configure_gradient_clipping is ModelTask.configure_gradient_clipping
    assert task_cls.optimizer_step is L.LightningModule.optimizer_step
    assert task_cls.fused_optimizer is ModelTask.fused_optimizer

    trainer_args = config.trainer
    precision = _gpu_precision(config)
    assert precision in ("bf16-mixed", "32-true", "32", "bf16-true"), precision  # CPU runs it
    clip = trainer_args.get("gradient_clip_val")
    algorithm = trainer_args.get("gradient_clip_algorithm") or "norm"
    accumulate = int(trainer_args.get("accumulate_grad_batches") or 1)
    monkeypatch.setenv(FUSED_ENV, "1")  # what CUDA parameters get (CPU ones too, unset)
    task = StandIn()
    start = [p.detach().clone() for p in task.model.parameters()]
    data = DataLoader(TensorDataset(torch.randn(4 * accumulate, 6)), batch_size=4)
    trainer = L.Trainer(accelerator="cpu", devices=1, precision=precision,
                        gradient_clip_val=clip, gradient_clip_algorithm=algorithm,
                        accumulate_grad_batches=accumulate, max_steps=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(task, data)  # before the fix: RuntimeError at the first clipping
    assert trainer.global_step == 1
    optimizer = trainer.optimizers[0]
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["fused"]
    moved = [not torch.equal(a, p.detach()) for a, p in zip(start, task.model.parameters(),
                                                              strict=True)]
    assert all(moved)
    if not clip:
        for got, was in zip(task.after, task.before, strict=True):
            assert torch.equal(got, was)  # nothing to clip: the gradients as they were
        return
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in task.before))
    if algorithm == "value":
        want = [g.clamp(-clip, clip) for g in task.before]
    else:
        assert norm > clip, "the test loss should need clipping"
        want = [g * (clip / (norm + 1e-6)) for g in task.before]
    for got, expected in zip(task.after, want, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_fused_adamw_is_clipped_under_every_cpu_precision(
        precision: str, algorithm: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FUSED_ENV, "1")
    task = StandIn()
    trainer = L.Trainer(accelerator="cpu", precision=precision, gradient_clip_val=0.5,
                        gradient_clip_algorithm=algorithm, max_steps=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(task, DataLoader(TensorDataset(torch.randn(8, 6)), batch_size=4))
    assert trainer.global_step == 2 and trainer.optimizers[0].defaults["fused"]
    if algorithm == "value":
        assert max(float(g.abs().max()) for g in task.after) <= 0.5
    else:
        after = math.sqrt(sum(float(g.pow(2).sum()) for g in task.after))
        assert after == pytest.approx(0.5, rel=1e-4)


def test_the_fused_choice() -> None:
    cpu = [nn.Parameter(torch.zeros(2))]
    assert use_fused(cpu) is True  # CPU has the fused kernel too
    assert use_fused(cpu, True) is True and use_fused(cpu, False) is False
    assert use_fused([nn.Parameter(torch.zeros(2, dtype=torch.complex64))]) is False
    model = Tiny()
    assert adamw(model, 1e-3, fused=True).defaults["fused"] is True
    assert not adamw(model, 1e-3, fused=False).defaults["fused"]


def test_the_fused_choice_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = [nn.Parameter(torch.zeros(2))]
    for value, want in (("1", True), ("true", True), ("0", False), ("auto", True)):
        monkeypatch.setenv(FUSED_ENV, value)
        assert use_fused(cpu) is want, value
    monkeypatch.setenv(FUSED_ENV, "0")
    assert use_fused(cpu, True) is True  # an explicit choice wins
    monkeypatch.setenv(FUSED_ENV, "sometimes")
    with pytest.raises(ValueError, match=FUSED_ENV):
        use_fused(cpu)


def _attached(task: ModelTask, trainer: Any) -> ModelTask:
    task._trainer = trainer  # what Lightning sets when it attaches the task
    return task


def test_a_gradient_scaler_with_clipping_gets_the_foreach_adamw() -> None:
    """16-mixed (a GradScaler) unscales before Lightning clips; a fused step would unscale
    inside its kernel, after the clipping: such a run gets the non-fused AdamW."""
    scaler = SimpleNamespace(precision_plugin=SimpleNamespace(scaler=object()),
                             gradient_clip_val=1.0)
    assert _attached(StandIn(), scaler).fused_optimizer() is False
    no_clip = SimpleNamespace(precision_plugin=SimpleNamespace(scaler=object()),
                              gradient_clip_val=None)
    assert _attached(StandIn(), no_clip).fused_optimizer() is None
    bf16 = SimpleNamespace(precision_plugin=SimpleNamespace(scaler=None), gradient_clip_val=1.0)
    assert _attached(StandIn(), bf16).fused_optimizer() is None


def test_fsdp_clips_by_norm_through_its_root_module() -> None:
    """Lightning's FSDP plugin refuses clipping by norm (configs/vit_base_fsdp.yaml asks
    for it); the root FSDP module's clip_grad_norm_ is the norm over every shard."""
    calls: list[float] = []

    class FSDPStrategy:  # stands for lightning's, by name
        model = SimpleNamespace(clip_grad_norm_=calls.append)

    trainer = SimpleNamespace(strategy=FSDPStrategy(),
                              precision_plugin=SimpleNamespace(scaler=None))
    task = _attached(StandIn(), trainer)
    opt = torch.optim.SGD(task.parameters(), lr=0.1)
    ModelTask.configure_gradient_clipping(task, opt, 1.0, "norm")
    assert calls == [1.0]


def test_fused_and_loop_adamw_make_the_same_update() -> None:
    """The fused kernel (the default now, also on CPU) against torch's per-tensor loop
    (the default before): 50 steps from the same start and gradients agree to rounding."""
    torch.manual_seed(0)
    a = Tiny()
    b = Tiny()
    b.load_state_dict(a.state_dict())
    fused, loop = adamw(a, 1e-2, fused=True), adamw(b, 1e-2, fused=False)
    assert fused.defaults["fused"] and not loop.defaults["fused"]
    for _ in range(50):
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
            pa.grad = torch.randn_like(pa)
            pb.grad = pa.grad.clone()
        fused.step()
        loop.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa.detach(), pb.detach(), rtol=1e-5, atol=1e-5)


def test_clip_gradients_matches_the_formulas() -> None:
    p, q = nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2))
    p.grad, q.grad = torch.tensor([3.0, 0.0, 0.0]), torch.tensor([0.0, 4.0])  # norm 5
    opt = torch.optim.SGD([p, q], lr=0.1)
    clip_gradients(opt, 1.0, "norm")
    torch.testing.assert_close(p.grad, torch.tensor([0.6, 0.0, 0.0]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(q.grad, torch.tensor([0.0, 0.8]), rtol=1e-5, atol=1e-6)
    p.grad = torch.tensor([3.0, -2.0, 0.1])
    clip_gradients(opt, 1.0, "value")
    torch.testing.assert_close(p.grad, torch.tensor([1.0, -1.0, 0.1]))
    with pytest.raises(ValueError, match="norm' or 'value"):
        clip_gradients(opt, 1.0, "max")


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_no_config_pins_the_cpu(path: Path) -> None:
    """A GPU node runs every shipped config on its GPU (accelerator auto or gpu)."""
    import yaml

    trainer = yaml.safe_load(path.read_text())["trainer"]
    assert str(trainer.get("accelerator", "auto")) in ("auto", "gpu", "cuda"), path.stem


@pytest.mark.parametrize(("value", "want"), [(True, {}), ("true", {}),
                                             ("reduce-overhead", {"mode": "reduce-overhead"}),
                                             ("max-autotune", {"mode": "max-autotune"})])
def test_compile_takes_a_mode(value: Any, want: dict[str, str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    """compile: true compiles with torch's default; a mode name reaches torch.compile
    (reduce-overhead: CUDA graphs on a GPU)."""
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(nn.Module, "compile", lambda self, **kw: seen.append(kw))
    ModelTask(Tiny(), compile=value)
    assert seen == [want]


@pytest.mark.parametrize("value", [False, None, "false"])
def test_compile_off(value: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(nn.Module, "compile", lambda self, **kw: seen.append(kw))
    ModelTask(Tiny(), compile=value)
    assert seen == []


def test_an_unknown_compile_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="reduce-overhead"):
        ModelTask(Tiny(), compile="fast")


class _Recorder(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, float]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if "train/loss" in metrics:
            self.rows.append((int(step or 0), float(metrics["train/loss"])))


class Logged(StandIn):
    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []
        self.log_calls = 0

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        self.losses.append(float(loss.detach()))  # the test's record, not the task's
        self.log_train("train/loss", loss)
        return loss

    def log(self, *args: Any, **kwargs: Any) -> None:
        self.log_calls += 1
        super().log(*args, **kwargs)


def test_training_metrics_are_logged_as_window_means_every_n_steps(tmp_path: Path) -> None:
    """log_train: self.log only on the steps the logger writes (every log_every_n_steps)
    and the epoch's last, with the mean of the steps since the previous write."""
    task, recorder = Logged(), _Recorder()
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, log_every_n_steps=5,
                        logger=recorder, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path)
    trainer.fit(task, DataLoader(TensorDataset(torch.randn(48, 6)), batch_size=4))
    assert len(task.losses) == 12
    assert task.log_calls == 3  # steps 5, 10 and the last (12), not 12 calls
    windows = [task.losses[0:5], task.losses[5:10]]
    got = [value for _, value in recorder.rows]
    assert got[:2] == pytest.approx([sum(w) / len(w) for w in windows], rel=1e-6)
    # the last batch's value reached the epoch's metrics: the mean of steps 11-12
    assert float(trainer.callback_metrics["train/loss"]) == pytest.approx(
        sum(task.losses[10:]) / 2, rel=1e-6)


def test_a_drawn_bar_gets_a_value_every_refresh(tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import TQDMProgressBar

    task = Logged()
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, log_every_n_steps=50, logger=False,
                        enable_checkpointing=False, enable_model_summary=False,
                        callbacks=[TQDMProgressBar(refresh_rate=4)], default_root_dir=tmp_path)
    trainer.fit(task, DataLoader(TensorDataset(torch.randn(40, 6)), batch_size=4))
    assert task.log_calls == 3  # values 4, 8 and the last batch (10), of 10 steps


def test_the_cli_bar_refreshes_every_few_steps() -> None:
    from lightning.pytorch.callbacks import TQDMProgressBar

    from multimodal.cli.main import PROGRESS_REFRESH_STEPS, progress_bar

    bar = progress_bar({"enable_progress_bar": True, "callbacks": []})
    assert isinstance(bar, TQDMProgressBar) and bar.refresh_rate == PROGRESS_REFRESH_STEPS > 1
    assert progress_bar({"enable_progress_bar": False}) is None
    own = TQDMProgressBar(refresh_rate=1)
    assert progress_bar({"enable_progress_bar": True, "callbacks": [own]}) is None


def test_the_own_step_configs_ask_for_no_clipping() -> None:
    """Word2Vec's own SGD step would ignore gradient clipping: its config asks for none."""
    import yaml

    for path in CONFIGS:
        if path.stem in OWN_STEP:
            trainer = yaml.safe_load(path.read_text()).get("trainer") or {}
            assert not trainer.get("gradient_clip_val"), path.stem
