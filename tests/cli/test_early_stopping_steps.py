"""``early_stopping`` with a ``max_steps`` that ends the run before its first validation
(#50): Lightning's EarlyStopping, checked at the end of a training epoch, found no
``val/loss`` there and ended the run with "Early stopping conditioned on metric `val/loss`
which is not available"; the CLI's checks it after each validation instead."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping

from tests.cli.test_faults import digits_config


def test_max_steps_before_the_first_validation_ends_normally(tmp_path, capsys):
    from multimodal.cli.verbs import run

    cfg = digits_config(tmp_path)  # 2 steps an epoch, validation at its end
    code = run(["fit", "--config", str(cfg), "--early_stopping", "2", "--trainer.max_steps",
                "1", "--test_after_fit", "false"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "error:" not in err and "not available" not in err
    last = tmp_path / "run" / "version_0" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 1


def test_early_stopping_still_stops_on_a_stalled_validation_loss(tmp_path):
    """Checked after each validation: with patience 1 and a learning rate of 1e-30 (the loss
    never improves) the run stops after the second validation, not at max_epochs."""
    from multimodal.cli.main import MultimodalCLI

    cfg = digits_config(tmp_path, "max_epochs: 6")
    cli = MultimodalCLI(args=["--config", str(cfg), "--early_stopping", "1",
                              "--model.init_args.optimizer", "{lr: 1.0e-30}"], run=False)
    stopper = next(c for c in cli.trainer.callbacks if isinstance(c, EarlyStopping))
    assert stopper._check_on_train_epoch_end is False
    L.seed_everything(0, verbose=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.trainer.current_epoch == 2  # validations 1 and 2, then stopped
    assert stopper.stopped_epoch == 1
