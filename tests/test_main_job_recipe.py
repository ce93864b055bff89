"""benchmarks/main_job_recipe.py: a recipe's step trains the config's model on the config's
data, and the run cost is the formula of its docstring (checked on injected step times)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("main_job_recipe",
                                                  ROOT / "benchmarks" / "main_job_recipe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _digits_config() -> dict:
    cfg = yaml.safe_load((ROOT / "configs" / "vit_fashion_mnist.yaml").read_text())
    assert cfg["model"]["init_args"]["preset"] == "vit_fashion_mnist"
    cfg["model"]["init_args"]["overrides"] = dict(image_size=8, patch_size=2, dim=32, heads=4,
                                                  mlp_dim=64, depth=1)
    cfg["data"]["init_args"].update(dataset="digits", batch_size=64, val_size=0.2,
                                    image_size=None)
    cfg["trainer"]["max_epochs"] = 7
    return cfg


def test_set_builds_nested_overrides():
    bench = _bench()
    cfg = {"data": {"init_args": {"batch_size": 128}}}
    bench._set(cfg, "data.init_args.batch_size", 256)
    bench._set(cfg, "model.init_args.compile", True)
    assert cfg == {"data": {"init_args": {"batch_size": 256}},
                   "model": {"init_args": {"compile": True}}}


def test_recipe_trains_its_model_and_prices_the_run():
    torch.manual_seed(0)
    cfg = _digits_config()
    recipe = _bench().Recipe("digits", cfg)
    assert recipe.model.config.stem == "conv"  # the main job's stem, on 8x8 digits
    # the config's optimizer: block (lr 0.003, weight decay 0.05 on the decayed group)
    assert cfg["model"]["init_args"]["optimizer"]["lr"] == 0.003
    assert [(g["lr"], g["weight_decay"]) for g in recipe.opt.param_groups] == \
        [(0.003, 0.05), (0.003, 0.0)]
    before = {k: v.clone() for k, v in recipe.model.state_dict().items()}
    recipe.train_step()
    recipe.val_step()
    moved = [k for k, v in recipe.model.state_dict().items() if not torch.equal(v, before[k])]
    assert "head.weight" in moved and "patch_embed.proj.0.weight" in moved
    # an epoch is every training image once, in batches of 64 (the last one short)
    n = len(recipe.train_loader.dataset)
    assert 1000 < n < 1797 and (recipe.n_train, recipe.epochs) == (-(-n // 64), 7)
    recipe.train_times, recipe.val_times = [0.1, 0.3, 0.2], [0.05, 0.01, 0.02]
    epoch, run = recipe.run_cost()
    by_hand_epoch = recipe.n_train * 0.2 + recipe.n_val * 0.02
    assert epoch == pytest.approx(by_hand_epoch)
    assert run == pytest.approx(7 * by_hand_epoch + -(-10_000 // 64) * 0.02)
