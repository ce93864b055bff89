"""``multimodal fit / validate / test / predict``: LightningCLI over every task and data
module (:func:`run_lightning`; the command's table of verbs is :mod:`multimodal.cli.verbs`,
the other verbs are in :mod:`multimodal.cli.inference`).

    multimodal fit      --config configs/vit_fashion_mnist.yaml [--trainer.max_epochs 3 ...]
    multimodal validate --config ... --ckpt_path best
    multimodal test     --config ... --ckpt_path last
    multimodal predict  --config ... --ckpt_path best --data.init_args.predict my_images/
    multimodal predict  --ckpt_path run/version_0/checkpoints/last.ckpt --data.init_args.predict D
    multimodal speak    --model tts.ckpt --text "Hello there." --prompt voice.wav --out out.wav
    multimodal embed    --model FOLDER --inputs DIR|MANIFEST --out emb.safetensors
    multimodal zero-shot --model CLIP_FOLDER --labels "cat,dog" --inputs DIR [--out p.csv]
    multimodal caption  --model captioner.ckpt|FOLDER --inputs DIR
    multimodal transcribe --model WHISPER_DIR --inputs clips/ [--out transcripts.csv]

Every value of the YAML can be overridden on the command line. ``fit`` resumes an
interrupted run with ``--ckpt_path last`` (the newest whole checkpoint: a truncated or
corrupted newer file is skipped with a warning naming it) and, unless
``--test_after_fit false``, tests the best checkpoint when training ends. SIGTERM or
SLURM's SIGUSR1 saves ``<checkpoints>/last.ckpt`` at the end of the step in progress and
exits with 128 + the signal (143 for SIGTERM); ``--checkpoint_every_minutes N`` saves it
every N minutes as well (:class:`~multimodal.cli.callbacks.Preemption`, docs/cluster.md).
When standard output is not a terminal (a log file, a batch job) every validation prints
one plain line of metrics instead of Lightning's progress bar
(``--trainer.enable_progress_bar true`` brings the bar back); a drawn bar redraws every
:data:`PROGRESS_REFRESH_STEPS` steps, so that no step waits for the device to read a metric.

A config says only what differs from the CLI's trainer defaults (:func:`add_run_defaults`):
TensorBoard + CSV loggers, a :class:`~multimodal.cli.callbacks.RunCheckpoint` (``last.ckpt``,
the latest state at every epoch end, and the best by the task's metric, or ``--monitor`` /
``--monitor_mode``, ties to the lower ``val/loss`` then the later step) and a
``LearningRateMonitor``. ``trainer.min_steps`` is a step budget: the CLI raises ``max_epochs``
to reach it for the data size (:class:`~multimodal.cli.callbacks.StepBudget`).

A config names its model (``preset: NAME`` + ``overrides``, :mod:`multimodal.tasks.presets`)
and writes each size once, in the data section: the data module's ``class_names`` and
``model_sizes`` (image size, channels, mel bins, vocabulary sizes, sequence lengths,
codebooks) are linked into the task when the data module is made (so ``--print_config``
shows the preset, its overrides and the data section, where each size is written).

Model and data agree at one moment, when the data module is made
(:meth:`MultimodalCLI.make_data`, before the task): with ``pretrained``, the data module is
built with the settings the model sets (:func:`follow_pretrained`), then the task's class
names and sizes are taken from it and, with ``pretrained``, it is checked against the part of
the model the task trains, built on ``meta`` (:func:`agree`); the links above read that one
answer, and the task's ``setup`` has nothing left to check.

Everything a run writes lives under ``trainer.default_root_dir`` (``runs/<name>`` in the
shipped configs), so ``--trainer.default_root_dir /some/dir`` moves the whole run:
checkpoints go to ``<root>/version_N/checkpoints`` (N: the run's number, as its logs'; a
re-run never replaces an earlier run's checkpoints) unless a ModelCheckpoint names its own
``dirpath``,
and the string ``${trainer.default_root_dir}`` in any config value (the loggers' ``save_dir``,
a task's ``save_dir``, a tokenizer file) is replaced by the root after the command-line
overrides are read. See :func:`place_run_outputs`.

Precision: with ``trainer.precision`` unset (or ``null``) the run picks it by
:func:`multimodal.cli.precision.auto_precision` (bf16 autocast on a GPU with bf16, and on a CPU
with native bf16 for models above the measured size threshold; fp32 elsewhere; see
docs/precision.md); ``--trainer.precision 32-true`` (or any Lightning precision) overrides
it. Either way the run logs one line ``precision: <value> (<why>)``. On a CUDA GPU fp32
matmuls use TF32 tensor cores (``torch.set_float32_matmul_precision("high")``, one log line;
``MULTIMODAL_TF32=0`` keeps full fp32: :func:`multimodal.cli.precision.matmul_precision`);
a run told ``accelerator: cpu`` on a machine with a GPU says that it leaves the GPU unused.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import os
import re
import sys
import warnings
from pathlib import Path, PurePath
from typing import Any, Literal

import lightning as L
import torch
from jsonargparse import Namespace
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from multimodal.cli.callbacks import (
    EpochSummary,
    Preemption,
    RunCheckpoint,
    StepBudget,
    checkpoint_problem,
    resume_checkpoint,
)
from multimodal.cli.errors import UsageError
from multimodal.cli.faults import (
    OutOfMemory,
    RunGuard,
    out_of_memory_kind,
    out_of_memory_message,
)
from multimodal.cli.precision import auto_precision, matmul_precision, unused_gpu
from multimodal.files import sniff_torch_file
from multimodal.progress import is_terminal

ROOT_PLACEHOLDER = "${trainer.default_root_dir}"
"""Written in a config value, stands for the run's root folder (resolved after overrides)."""


def _substitute(value: Any, root: str) -> Any:
    if isinstance(value, str):
        return value.replace(ROOT_PLACEHOLDER, root)
    if isinstance(value, PurePath):
        return type(value)(str(value).replace(ROOT_PLACEHOLDER, root))
    if isinstance(value, Namespace):
        for key, item in vars(value).items():
            setattr(value, key, _substitute(item, root))
        return value
    if isinstance(value, dict):
        return {key: _substitute(item, root) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_substitute(item, root) for item in value)
    return value


def _is_model_checkpoint(class_path: Any) -> bool:
    cls = _class_of(class_path)
    return cls is not None and issubclass(cls, ModelCheckpoint)


def place_run_outputs(config: Namespace) -> str:
    """Put every file a run writes under its ``trainer.default_root_dir``; returns the root.

    ``config``: one subcommand's parsed config (after command-line overrides), changed in place.

    * ``${trainer.default_root_dir}`` inside any string value becomes the root
      (``save_dir: ${trainer.default_root_dir}`` for the loggers gives ``<root>/version_N``);
    * the run is ``<root>/version_N``, N the next free number there (:func:`next_version`);
      the loggers writing into ``<root>`` with no name and no ``version`` (the defaults:
      TensorBoard + CSV) get that N, and so do the checkpoints: a ``ModelCheckpoint`` without
      ``dirpath`` gets ``<root>/version_N/checkpoints``, so a second run of a config never
      replaces the first one's checkpoints. ``--ckpt_path last`` looks in every
      ``<root>/version_*/checkpoints`` (and the ``<root>/checkpoints`` of runs made before)
      and takes the newest whole checkpoint
      (:func:`~multimodal.cli.callbacks.resume_checkpoint`);
    * loggers elsewhere that share one folder (TensorBoard + CSV) and name no ``version`` get
      the same next free ``version_N``: each would otherwise count the other's folder and the
      logs of one run would be split over two versions.

    The root is the current directory when ``default_root_dir`` is not set (Lightning's default).
    """
    root = str(config.get("trainer.default_root_dir") or os.getcwd())
    _substitute(config, root)
    version = _root_logger_version(config.get("trainer.logger"), root)
    callbacks = config.get("trainer.callbacks")
    for callback in callbacks if isinstance(callbacks, list) else []:
        if not isinstance(callback, Namespace) or not _is_model_checkpoint(
                callback.get("class_path")):
            continue
        if callback.get("init_args") is None:
            callback["init_args"] = Namespace()
        if callback.get("init_args.dirpath") is None:
            callback["init_args.dirpath"] = os.path.join(root, f"version_{version}",
                                                          "checkpoints")
    _share_logger_version(config.get("trainer.logger"))
    return root


def next_version(folder: str | os.PathLike[str]) -> int:
    """One more than the highest ``version_N`` folder in ``folder`` (0 when there is none):
    the number the loggers give a new run there."""
    taken = [int(p.name[len("version_"):]) for p in Path(folder).glob("version_*")
             if p.is_dir() and p.name[len("version_"):].isdigit()]
    return max(taken, default=-1) + 1


def _root_logger_version(loggers: Any, root: str) -> int:
    """The ``version_N`` of the run in ``root``: a version given to a logger writing there
    (no name), else :func:`next_version`, which is then given to every such logger."""
    mine = []
    for logger in loggers if isinstance(loggers, list) else []:
        args = logger.get("init_args") if isinstance(logger, Namespace) else None
        if isinstance(args, Namespace) and args.get("save_dir") is not None \
                and not args.get("name") and "version" in args \
                and os.path.normpath(str(args.save_dir)) == os.path.normpath(root):
            mine.append(args)
    fixed = [a.get("version") for a in mine if isinstance(a.get("version"), int)]
    version = fixed[0] if fixed else next_version(root)
    for args in mine:
        if args.get("version") is None:
            args["version"] = version
    if len(mine) > 1:
        _quiet_second_logger(os.path.join(root, ""), version)
    return version


def _quiet_second_logger(folder: str, version: int) -> None:
    # the folder is new: the second logger finds the first one's files in it, and the
    # CSV logger's "exists and is not empty ... will be deleted" would be a false alarm
    warnings.filterwarnings(
        "ignore", message="Experiment logs directory .*" + re.escape(
            os.path.join(os.path.basename(os.path.normpath(folder)), f"version_{version}"))
        + " exists and is not empty")


DEFAULT_LOGGERS = ("lightning.pytorch.loggers.TensorBoardLogger",
                   "lightning.pytorch.loggers.CSVLogger")
"""The loggers a run gets when its config names none: both write ``<root>/version_N``."""

DEFAULT_MONITOR = ("val/loss", "min")
"""What the default ``ModelCheckpoint`` ranks by when neither ``--monitor`` nor the task's
``default_monitor`` says otherwise."""


LAST_EVERY_SECONDS = 60.0
"""The default checkpoint writes ``last.ckpt`` at every epoch end, except those less than
this many seconds after the previous one (short epochs of small data), and at the end."""

_LOWER_IS_BETTER = ("loss", "bpd", "perplexity", "wer", "cer")


def _has_callback(callbacks: list[Any], base: type) -> bool:
    for callback in callbacks:
        cls = _class_of(callback.get("class_path")) if isinstance(callback, Namespace) \
            else type(callback)
        if cls is not None and issubclass(cls, base):
            return True
    return False


def add_run_defaults(config: Namespace) -> None:
    """The CLI's trainer defaults, so that a config says only what differs; ``config`` (one
    subcommand's, after overrides) is changed in place, before :func:`place_run_outputs`.

    * ``trainer.logger`` unset (or ``true``): TensorBoard and CSV, both in
      ``${trainer.default_root_dir}`` with no name, so one run's logs are ``<root>/version_N``;
      ``--trainer.logger false`` keeps a run without loggers;
    * no ``ModelCheckpoint`` among ``trainer.callbacks`` (and checkpointing not switched off):
      a :class:`~multimodal.cli.callbacks.RunCheckpoint` keeping ``last.ckpt`` (the latest
      state: written at every epoch end whatever the metric does, at most once a minute
      (:data:`LAST_EVERY_SECONDS`) when epochs are shorter, and at the end) and the
      best ``best-<epoch>-<value>.ckpt`` (ties: the lower ``val/loss``, then the later
      step) by the metric of
      ``--monitor`` / ``--monitor_mode`` (in a config: top-level ``monitor:`` /
      ``monitor_mode:``), by default the task class's ``default_monitor``
      (:data:`DEFAULT_MONITOR` when it has none);
    * ``early_stopping: N`` (``--early_stopping N``; the own-data configs set it) and no
      ``EarlyStopping`` among the callbacks: one on ``val/loss`` (min) with patience N
      validations. With ``trainer.min_steps`` (the step budget, :class:`StepBudget`) a run
      trains at least that many steps, then stops once the validation loss stalls. It is
      checked after each validation, not at the end of a training epoch: a run that
      ``max_steps`` ends before its first validation ends normally (an ``EarlyStopping``
      of your own that leaves ``check_on_train_epoch_end`` unset gets the same);
    * a ``LearningRateMonitor`` when there is a logger and the config names none.
    """
    root = ROOT_PLACEHOLDER
    trainer = config.get("trainer")
    if not isinstance(trainer, Namespace):
        return
    if trainer.get("logger") in (None, True):
        trainer["logger"] = [Namespace(class_path=path, init_args=Namespace(
            save_dir=root, name="", version=None)) for path in DEFAULT_LOGGERS]
    callbacks = trainer.get("callbacks")
    callbacks = list(callbacks) if isinstance(callbacks, list) else \
        [] if callbacks is None else [callbacks]
    if trainer.get("enable_checkpointing") is not False and \
            not _has_callback(callbacks, ModelCheckpoint):
        task = _class_of(config.get("model.class_path"))
        metric, mode = getattr(task, "default_monitor", None) or DEFAULT_MONITOR
        if config.get("monitor") and config["monitor"] != metric:
            metric = str(config["monitor"])
            mode = "min" if any(k in metric for k in _LOWER_IS_BETTER) else "max"
        mode = config.get("monitor_mode") or mode
        callbacks.append(Namespace(
            class_path="multimodal.cli.callbacks.RunCheckpoint",
            init_args=Namespace(monitor=metric, mode=mode, save_last=True,
                                last_every_seconds=LAST_EVERY_SECONDS,
                                filename=f"best-{{epoch}}-{{{metric}:.4f}}",
                                auto_insert_metric_name=False)))
    patience = config.get("early_stopping")
    if patience is not None and not _has_callback(callbacks, EarlyStopping):
        callbacks.append(Namespace(
            class_path="lightning.pytorch.callbacks.EarlyStopping",
            init_args=Namespace(monitor="val/loss", mode="min", patience=int(patience),
                                check_on_train_epoch_end=False)))
    if trainer.get("logger") not in (None, False, []) and \
            not _has_callback(callbacks, LearningRateMonitor):
        callbacks.append(Namespace(
            class_path="lightning.pytorch.callbacks.LearningRateMonitor",
            init_args=Namespace()))
    trainer["callbacks"] = callbacks


def _share_logger_version(loggers: Any) -> None:
    folders: dict[str, list[Namespace]] = {}
    for logger in loggers if isinstance(loggers, list) else []:
        args = logger.get("init_args") if isinstance(logger, Namespace) else None
        if isinstance(args, Namespace) and args.get("save_dir") is not None \
                and "version" in args and args.get("version") is None:
            folder = os.path.join(str(args.save_dir), str(args.get("name") or ""))
            folders.setdefault(folder, []).append(args)
    for folder, shared in folders.items():
        if len(shared) < 2:
            continue
        version = next_version(folder)
        for args in shared:
            args["version"] = version
        _quiet_second_logger(folder, version)


def place_evaluation_outputs(subcommand: str | None, config: Namespace) -> None:
    """``test`` / ``validate`` / ``predict`` write nothing into the current directory:
    given a checkpoint file and no ``trainer.default_root_dir``, the run folder of the
    checkpoint (``<root>`` of ``<root>/checkpoints/x.ckpt``) is the root, so their logs and
    figures go to ``<root>/version_N`` beside the training run's; ``predict`` (which logs
    nothing) runs without loggers unless the config or command line names some. A checkpoint
    in ``<root>/version_N/checkpoints`` (or ``<root>/checkpoints``, runs made before) has the
    root ``<root>``."""
    trainer = config.get("trainer")
    if subcommand not in ("test", "validate", "predict") or not isinstance(trainer, Namespace):
        return
    if subcommand == "predict" and trainer.get("logger") is None:
        trainer["logger"] = False
    ckpt = config.get("ckpt_path")
    if trainer.get("default_root_dir") is None and ckpt and Path(str(ckpt)).is_file():
        trainer["default_root_dir"] = str(run_root(ckpt))


def run_root(ckpt: str | os.PathLike[str]) -> Path:
    """The run folder a checkpoint file belongs to: ``<root>`` of
    ``<root>/version_N/checkpoints/x.ckpt`` and of ``<root>/checkpoints/x.ckpt``; else the
    file's folder."""
    folder = Path(str(ckpt)).resolve().parent
    if folder.name != "checkpoints":
        return folder
    run = folder.parent
    return run.parent if re.fullmatch(r"version_\d+", run.name) else run


def continue_in_its_folder(trainer: L.Trainer, ckpt_path: str) -> None:
    """A resumed ``fit`` continues the run it resumes: a checkpoint callback writing to a
    fresh ``<root>/version_N/checkpoints`` of the same root writes to the resumed
    checkpoint's ``version_K/checkpoints`` instead (the run's ``last.ckpt`` moves on, its
    best checkpoints stay ranked: Lightning reloads them only from the same folder); its
    logs still go to a new ``version_N``. Likewise for ``test`` / ``predict`` (which write no
    checkpoint), so Lightning does not warn that the folder changed; a checkpoint in the
    ``<root>/checkpoints`` of a run made before counts as that run's folder."""
    folder = Path(ckpt_path).resolve().parent
    if folder.name != "checkpoints":
        return
    root = run_root(ckpt_path)
    for callback in trainer.checkpoint_callbacks:
        mine = Path(str(getattr(callback, "dirpath", "") or "")).resolve()
        if isinstance(callback, ModelCheckpoint) and mine.name == "checkpoints" \
                and re.fullmatch(r"version_\d+", mine.parent.name) \
                and mine.parent.parent == root and mine != folder:
            callback.dirpath = str(folder)


def resolve_precision(trainer_config: dict[str, Any], model: Any) -> tuple[Any, str]:
    """The precision a run uses and why: ``trainer_config["precision"]`` when set, else
    :func:`auto_precision` for the task's model (``model.model.config``) on
    ``trainer_config["accelerator"]``."""
    chosen = trainer_config.get("precision")
    if chosen is not None and str(chosen) != "auto":
        return chosen, "set by trainer.precision"
    config = getattr(getattr(model, "model", model), "config", None)
    precision, reason = auto_precision(config, str(trainer_config.get("accelerator") or "auto"))
    return precision, f"auto: {reason}; --trainer.precision overrides"


def _class_of(class_path: Any) -> type | None:
    if not isinstance(class_path, str) or "." not in class_path:
        return None
    module, name = class_path.rsplit(".", 1)
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    return cls if isinstance(cls, type) else None


def _defaults(cls: type) -> dict[str, Any]:
    return {n: p.default for n, p in inspect.signature(cls.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


def follow_pretrained(config: Namespace) -> list[str]:
    """With ``model.init_args.pretrained`` set, the data follows the model: every data
    argument the folder / checkpoint implies (:func:`multimodal.tasks.pretrained.data_settings`:
    image size, mean, std, waveforms for an audio front end, the tokenizer) is filled in
    where the config left the data module's default; a value set away from the model's is
    kept with a warning naming both. A classification task without ``modality`` gets the
    data's (image / audio / text), which picks the tower of a CLIP folder. Returns the
    warnings (also printed)."""
    from multimodal.data.contract import follow_settings
    from multimodal.tasks.pretrained import data_settings

    init = config.get("model.init_args")
    data = config.get("data")
    if not isinstance(init, Namespace) or init.get("pretrained") is None \
            or not isinstance(data, Namespace):
        return []
    data_cls = _class_of(str(data.get("class_path") or ""))
    if data_cls is None:
        return []
    data_modality(config)
    if data.get("init_args") is None:
        data["init_args"] = Namespace()
    follow = getattr(data_cls, "follow", None)  # the data-module contract
    settings = data_settings(init["pretrained"])
    implied = {"image": "image_size", "text": "tokenizer"}.get(str(init.get("modality")))
    if implied is not None and implied not in settings:  # e.g. a text model, image data
        _check_pretrained_part(config, str(init["pretrained"]), init.get("modality"))
    source = f"the pretrained model {init['pretrained']}"
    args = data["init_args"]
    given = {k: args.get(k) for k in settings if k in args}
    followed, warnings = follow(settings, given, source) if callable(follow) \
        else follow_settings(data_cls, settings, given, source)
    for key, value in followed.items():
        if key not in given or given[key] is not value:
            args[key] = value
    for line in warnings:
        rank_zero_warn(line)
    return warnings


def data_modality(config: Namespace) -> None:
    """With ``model.init_args.pretrained``, a task whose ``modality`` is unset gets the data
    module's (image / audio / text: the data-module contract), which picks the tower of a
    CLIP folder; in place, before anything is made."""
    init = config.get("model.init_args")
    if not isinstance(init, Namespace) or init.get("pretrained") is None \
            or "modality" not in init or init.get("modality") is not None:
        return
    data_cls = _class_of(str(config.get("data.class_path") or ""))
    if data_cls is not None:
        init["modality"] = getattr(data_cls, "modality", None) or None


def data_with_model(config: Namespace, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The data module's arguments ``kwargs`` (as the parser made them from ``config``)
    with what the pretrained model sets (:func:`follow_pretrained`, paths made absolute:
    :func:`absolute_data_paths`), written in ``config`` too (the run's config.yaml and the
    checkpoint's data arguments record them)."""
    args = config.get("data.init_args")
    before = args.as_dict() if isinstance(args, Namespace) else {}
    follow_pretrained(config)
    absolute_data_paths(config)
    args = config.get("data.init_args")
    after = args.as_dict() if isinstance(args, Namespace) else {}
    changed = {k: v for k, v in after.items() if k not in before or before[k] != v}
    return {**kwargs, **changed}


def check_model_source(config: Namespace) -> None:
    """A task that takes ``pretrained`` but is given none of ``pretrained``, ``preset`` or
    ``model`` (``configs/finetune_image.yaml`` as shipped, ``pretrained: null``) is a
    :class:`UsageError` before anything is built: the data module would otherwise fail
    first on a size that the pretrained model was to give (``image_size is needed``)."""
    init = config.get("model.init_args")
    if not isinstance(init, Namespace) or "pretrained" not in init or any(
            init.get(k) is not None for k in ("pretrained", "preset", "model")):
        return
    task = str(config.get("model.class_path") or "the task").rsplit(".", 1)[-1]
    raise UsageError(f"{task} needs a model to start from: --model.init_args.pretrained "
                     "FOLDER|NAME|CKPT (a model folder, an installed model's name from "
                     "`multimodal models`, or one of our checkpoints)",
                     "--model.init_args.pretrained")


def _check_pretrained_part(config: Namespace, pretrained: str, modality: str | None) -> None:
    """Where the pretrained model implies no data setting (a text model given to an image
    task), whether it has a part the task can train, before the data module is made: its one
    message (:func:`multimodal.loading.select_part`), not the data's ``image_size is
    needed`` first."""
    task = _class_of(str(config.get("model.class_path") or ""))
    accepts = getattr(task, "accepts", None)
    if task is None or not isinstance(accepts, tuple) or modality is None:
        return
    from multimodal.tasks.pretrained import pretrained_source

    try:  # the read the task's model comes from too (no model built here)
        source = pretrained_source(pretrained)
    except (FileNotFoundError, ValueError, OSError):  # the task's own load reports it
        return
    try:
        source.check_part(modality, accepts, task.__name__)
    except ValueError as err:
        raise UsageError(str(err), "--model.init_args.pretrained") from None


DATA_PATH_KEYS = ("train", "val", "test", "shards", "tokenizer")
"""The data module arguments that name the user's files and that a checkpoint keeps for a
later ``test`` / ``predict`` run. ``predict`` is not among them: it is read by the run that
names it, in its own directory, and the ids printed for it are its paths as given
(``new.txt:1``, not ``/home/.../new.txt:1``)."""


def absolute_data_paths(config: Namespace) -> list[str]:
    """Each data argument of :data:`DATA_PATH_KEYS` that names an existing relative path
    becomes absolute, in place; returns the keys changed. The checkpoint records the data
    module's arguments, and ``test`` / ``predict --ckpt_path`` rebuild the data from them:
    from another directory a relative ``train: my_photos/`` would name nothing there (the
    class names are read from it). URLs and names that are no path (an installed model's
    name as ``tokenizer``) are left as they are."""
    args = config.get("data.init_args")
    if not isinstance(args, Namespace):
        return []
    changed = []
    for key in DATA_PATH_KEYS:
        value = args.get(key)
        if isinstance(value, str) and value and "://" not in value \
                and not os.path.isabs(value) and os.path.exists(value):
            args[key] = os.path.abspath(value)
            changed.append(key)
    return changed


def agree(config: Namespace, datamodule: Any) -> Any:
    """The one moment model and data agree in a run (:func:`multimodal.tasks.agreement.
    reconcile`), called when the data module is made, before the task: the class names and
    model sizes the task takes from the data and, with ``model.init_args.pretrained``, the
    data checked against the part of that model the task trains (read from the source the
    task builds from: :func:`multimodal.tasks.pretrained.pretrained_source`). A
    contradiction is a :class:`UsageError` naming the data argument at fault."""
    from multimodal.tasks.agreement import DataMismatch, reconcile

    init = config.get("model.init_args")
    init = init.as_dict() if isinstance(init, Namespace) else dict(init or {})
    task = _class_of(str(config.get("model.class_path") or ""))
    source = None
    if init.get("pretrained") is not None:
        from multimodal.tasks.pretrained import pretrained_source

        try:
            source = pretrained_source(init["pretrained"])
        except (FileNotFoundError, ValueError, OSError):  # the task's own load reports it
            source = None
    try:
        return reconcile(datamodule, task, init, source)
    except DataMismatch as err:
        raise UsageError(str(err), f"--data.init_args.{err.key}") from None


def apply_skip_corrupt(config: Namespace) -> None:
    """``--skip_corrupt true|false`` sets the data module's ``skip_corrupt``; a data module
    that reads no files it could skip is a :class:`UsageError`."""
    value = config.get("skip_corrupt")
    data = config.get("data")
    if value is None or not isinstance(data, Namespace):
        return
    cls = _class_of(data.get("class_path"))
    if cls is None or "skip_corrupt" not in _defaults(cls):
        name = getattr(cls, "__name__", data.get("class_path"))
        raise UsageError(f"{name} reads no files that could be skipped", "--skip_corrupt")
    if data.get("init_args") is None:
        data["init_args"] = Namespace()
    data["init_args"]["skip_corrupt"] = bool(value)


def stored_optimizer_keys(config: Namespace) -> None:
    """The flat optimiser keys (``lr`` ...) of a ``--ckpt_path`` checkpoint written before
    the ``optimizer`` block, which LightningCLI reads back into ``model.dict_kwargs``, moved
    into the block, in place: the checkpoint's values win over the config's, as LightningCLI
    lets every stored hyper-parameter win. (Typed on the command line or written in a
    config, a flat key is an unknown option: :func:`multimodal.cli.errors.describe` names
    the block's spelling.)"""
    from multimodal.tasks.optim import OPTIMIZER_KEYS, OptimizerConfig

    model = config.get("model")
    stored = model.get("dict_kwargs") if isinstance(model, Namespace) else None
    flat = {k: stored.pop(k) for k in OPTIMIZER_KEYS if k in (stored or {})}
    if not flat or not isinstance(model.get("init_args"), Namespace):
        return
    block = model.init_args.get("optimizer")
    block = block.as_dict() if isinstance(block, Namespace) else \
        dataclasses.asdict(block) if isinstance(block, OptimizerConfig) else dict(block or {})
    model.init_args["optimizer"] = {**block, **{k: list(v) if isinstance(v, tuple) else v
                                               for k, v in flat.items() if v is not None}}


LIMIT_OPTIONS = ("max_epochs", "max_steps")
"""The trainer's limits that, typed on the command line, win over a config's budget."""


def command_line_limits(argv: list[str]) -> dict[str, int]:
    """The limits of :data:`LIMIT_OPTIONS` typed in ``argv`` (``--trainer.max_epochs 1`` or
    ``--trainer.max_epochs=1``), by name: the user's intent, over a config's step budget
    (``trainer.min_steps``, ``--budget_minutes``) and a task's own length. A value that is
    not an integer is left to the parser to report."""
    given = {}
    for name in LIMIT_OPTIONS:
        value = _option(argv, f"--trainer.{name}")
        if value is not None:
            try:
                given[name] = int(value)
            except ValueError:
                continue
    return given


AUTO_BATCH_OPTIONS = ("--data.init_args.batch_size", "--data.batch_size")


def take_auto_batch_size(argv: list[str]) -> tuple[list[str], bool]:
    """``argv`` without ``--data.init_args.batch_size auto`` (or ``=auto``; the config's
    batch size is then where the search starts), and whether it was there."""
    out, auto, i = [], False, 0
    while i < len(argv):
        arg = argv[i]
        if arg in AUTO_BATCH_OPTIONS and i + 1 < len(argv) and argv[i + 1] == "auto":
            auto, i = True, i + 2
            continue
        if "=" in arg and arg.split("=", 1)[0] in AUTO_BATCH_OPTIONS \
                and arg.split("=", 1)[1] == "auto":
            auto, i = True, i + 1
            continue
        out.append(arg)
        i += 1
    return out, auto


def _step_fits(trainer: L.Trainer, task: L.LightningModule, data: L.LightningDataModule,
               size: int) -> bool:
    """Whether one training step (forward and backward, under the run's precision) of a
    batch of ``size`` runs without running out of memory. Nothing is logged or updated:
    the gradients are dropped."""
    from lightning.fabric.utilities.apply_func import move_data_to_device

    device = trainer.strategy.root_device
    data.batch_size = size
    log, task.log = task.log, lambda *args, **kwargs: None  # type: ignore[method-assign]
    try:
        batch = next(iter(data.train_dataloader()))
        batch = data.on_before_batch_transfer(batch, 0)
        batch = data.on_after_batch_transfer(move_data_to_device(batch, device), 0)
        with trainer.precision_plugin.forward_context():
            loss = task.training_step(batch, 0)
        loss = loss["loss"] if isinstance(loss, dict) else loss
        if loss is not None and loss.requires_grad:
            loss.backward()
        return True
    except Exception as err:
        if out_of_memory_kind(err) is None:
            raise
        return False
    finally:
        task.log = log  # type: ignore[method-assign]
        task.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()


def largest_batch_size(trainer: L.Trainer, task: L.LightningModule,
                       data: L.LightningDataModule) -> int:
    """The largest batch size of ``data`` whose training step fits in memory: doubling from
    the data module's batch size while a step fits (halving first if that one does not),
    then a binary search between the last size that fitted and the first that did not;
    capped at the training set's size. Each trial is one forward and backward pass
    (:func:`_step_fits`). The result is set on the data module and its hyper-parameters
    (so the checkpoint stores it)."""
    from multimodal.tasks.base import loader_examples

    data.setup("fit")
    task.trainer = trainer  # attached as fit will attach it: the steps may read it
    task.to(trainer.strategy.root_device)
    n = loader_examples(data.train_dataloader) or 2 ** 20
    size = min(max(1, int(data.batch_size)), n)
    while not _step_fits(trainer, task, data, size):
        if size == 1:
            raise torch.OutOfMemoryError("batch_size auto: even a batch of 1 does not fit")
        size //= 2
    low, high = size, None  # low fits; high (once known) does not
    while low < n and high is None:
        if _step_fits(trainer, task, data, min(2 * low, n)):
            low = min(2 * low, n)
        else:
            high = min(2 * low, n)
    while high is not None and high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if _step_fits(trainer, task, data, mid) else (low, mid)
    data.batch_size = low
    if hasattr(data, "hparams"):
        data.hparams["batch_size"] = low  # stored with the checkpoint's data arguments
    return low


PROGRESS_REFRESH_STEPS = 10
"""A drawn progress bar redraws (and reads the step's metrics, a host sync on a GPU) every
this many steps, not every step."""


def _listed(callbacks: Any) -> list[Any]:
    return [] if callbacks is None else list(callbacks) if isinstance(callbacks, list) \
        else [callbacks]


def progress_bar(trainer_config: dict[str, Any]) -> Any:
    """The bar a run with ``enable_progress_bar`` and no progress bar among its callbacks
    gets: Lightning's tqdm bar refreshed every :data:`PROGRESS_REFRESH_STEPS` steps (its
    default redraws, and syncs with the device, every step). None otherwise."""
    from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar

    if not trainer_config.get("enable_progress_bar") or any(
            isinstance(c, ProgressBar) for c in _listed(trainer_config.get("callbacks"))):
        return None
    return TQDMProgressBar(refresh_rate=PROGRESS_REFRESH_STEPS)


class MultimodalCLI(LightningCLI):
    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """LightningCLI's, remembering the command line (:func:`command_line_limits`);
        ``--data.init_args.batch_size auto`` is taken out and searched for before fit
        (:func:`largest_batch_size`)."""
        args = [str(a) for a in args] if isinstance(args, (list, tuple)) else \
            sys.argv[1:] if args is None else args
        if isinstance(args, list):
            args, self.auto_batch_size = take_auto_batch_size(args)
        self.argv = args if isinstance(args, list) else []
        super().parse_arguments(parser, args)

    def before_fit(self) -> None:
        """``--data.init_args.batch_size auto``: the largest batch that fits, found now,
        logged, and stored in the checkpoint's data hyper-parameters."""
        if not getattr(self, "auto_batch_size", False):
            return
        before = int(self.datamodule.batch_size)
        size = largest_batch_size(self.trainer, self.model, self.datamodule)
        rank_zero_info(f"batch_size auto: {size} (the largest batch whose training step fits "
                       f"in memory, searched from {before})")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        place_evaluation_outputs(self.subcommand, config)
        if self.subcommand == "predict":  # nothing to record: no config.yaml in the root
            self.save_config_callback = None
        add_run_defaults(config)
        place_run_outputs(config)
        ckpt_path, init = config.get("ckpt_path"), config.get("model.init_args")
        if ckpt_path and Path(str(ckpt_path)).is_file() and isinstance(init, Namespace) \
                and init.get("pretrained") is not None:
            # the checkpoint holds the whole model: no need for the folder it started from
            init["pretrained"] = str(ckpt_path)
        elif ckpt_path and Path(str(ckpt_path)).is_file() and isinstance(init, Namespace) \
                and "pretrained" in init and self.subcommand in ("test", "validate", "predict"):
            # the trained model, head included, is built from the checkpoint (not a preset's
            # fresh head, then overwritten: "new head of 3 classes (was 1000)" read as if the
            # trained head were thrown away)
            init["pretrained"] = str(ckpt_path)
            for key in ("preset", "overrides", "model", "init_from"):
                if init.get(key) is not None:
                    init[key] = None
        data_modality(config)  # the data follows the model when the data module is made
        if not getattr(self, "_makes_data", False):  # no instantiators (LightningCLI's
            follow_pretrained(config)  # load_from_checkpoint_support=False): follow now
        stored_optimizer_keys(config)
        apply_skip_corrupt(config)
        absolute_data_paths(config)

    def instantiate_classes(self) -> None:
        """LightningCLI's, after :func:`check_model_source` (a task with no model to start
        from is named before the data module fails on a size the model was to give)."""
        check_model_source(self.config[self.subcommand] if self.subcommand else self.config)
        super().instantiate_classes()

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        precision, reason = resolve_precision(config, self.model)
        rank_zero_info(f"precision: {precision} ({reason})")
        bar = progress_bar(config)
        if bar is not None:
            kwargs["callbacks"] = [*_listed(config.get("callbacks")), bar]
        accelerator = str(config.get("accelerator") or "auto")
        matmul, why = matmul_precision(accelerator)
        if matmul is not None:
            import torch

            torch.set_float32_matmul_precision(matmul)
            rank_zero_info(f"float32 matmul precision: {matmul} ({why})")
        unused = unused_gpu(accelerator)
        if unused is not None:
            rank_zero_info(unused)
        trainer = super().instantiate_trainer(**{**kwargs, "precision": precision})
        if not any(isinstance(c, Preemption) for c in trainer.callbacks):
            minutes = self._get(self.config, "checkpoint_every_minutes", default=None)
            trainer.callbacks.append(Preemption(every_minutes=minutes))
        for stopper in trainer.callbacks:
            if isinstance(stopper, EarlyStopping) and \
                    getattr(stopper, "_check_on_train_epoch_end", False) is None:
                # on a validation's metrics: a train epoch that max_steps ends before the
                # first validation has none, and strict would end the run with an error
                stopper._check_on_train_epoch_end = False
        if not any(isinstance(c, RunGuard) for c in trainer.callbacks):
            trainer.callbacks.append(RunGuard(  # divergence, failed saves: multimodal.cli.faults
                on_nonfinite=self._get(self.config, "on_nonfinite", default=None) or "stop",
                on_save_error=self._get(self.config, "on_save_error", default=None) or "stop"))
        # a limit typed on the command line wins over the config's budget (StepBudget, and a
        # task's own length, e.g. finetune.contrastive_epochs, read it from the trainer)
        given = command_line_limits(getattr(self, "argv", []))
        trainer.command_line_limits = given  # type: ignore[attr-defined]
        if not any(isinstance(c, StepBudget) for c in trainer.callbacks):
            minutes = self._get(self.config, "budget_minutes", default=None)
            # trainer.min_steps raises max_epochs; --budget_minutes sizes it by time too
            trainer.callbacks.append(StepBudget(minutes=minutes, given=given))
        return trainer

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--test_after_fit", type=bool, default=True,
                            help="after fit, run test on the best checkpoint")
        # model and data agree at one moment (multimodal.tasks.agreement.reconcile): when the
        # data module is made, before the task. Its answer goes to the task through these
        # two links: a classifier's class_names (tasks without the argument ignore the
        # link; an explicit num_classes that disagrees is the task's error) and the sizes
        # the data fixes (image_size, in_channels, n_mels, vocab_size, max_len, ...: the data
        # module's model_sizes) for a preset's config: a config writes each once, in the
        # data section
        parser.link_arguments("data", "model.init_args.class_names",
                              compute_fn=self._agreed_class_names, apply_on="instantiate")
        parser.link_arguments("data", "model.init_args.data_sizes",
                              compute_fn=self._agreed_data_sizes, apply_on="instantiate")
        parser.add_argument("--monitor", type=str | None, default=None,
                            help="metric the default ModelCheckpoint keeps the best of "
                                 "(default: the task's, e.g. val/acc_macro)")
        parser.add_argument("--monitor_mode", type=Literal["max", "min"] | None, default=None,
                            help="max or min (default: min for a loss, else max; or the "
                                 "task's)")
        parser.add_argument("--skip_corrupt", type=bool | None, default=None,
                            help="leave out files that cannot be read (listed) instead of "
                                 "stopping at the first with an error naming it (sets the "
                                 "data module's skip_corrupt)")
        parser.add_argument("--early_stopping", type=int | None, default=None,
                            help="stop once val/loss has not improved for N validations "
                                 "(after trainer.min_steps; the own-data configs set 3)")
        parser.add_argument("--on_nonfinite", type=Literal["stop", "skip"], default="stop",
                            help="a non-finite training loss or gradient norm: stop (save "
                                 "last.ckpt, the last finite state, and exit) or skip the step")
        parser.add_argument("--on_save_error", type=Literal["stop", "continue"],
                            default="stop",
                            help="a checkpoint that cannot be written (a full disk): stop, or "
                                 "continue training without that save")
        parser.add_argument("--budget_minutes", type=float | None, default=None,
                            help="size the trainer.min_steps budget by time too: a run whose "
                                 "epochs were raised for it is cut to the steps that fit in "
                                 "N minutes (the own-data configs set it)")
        parser.add_argument("--checkpoint_every_minutes", type=float | None, default=None,
                            help="also save <checkpoints>/last.ckpt every N minutes of "
                                 "training (long epochs; see docs/cluster.md)")

    def _add_instantiators(self) -> None:
        """LightningCLI's, with :meth:`make_data` first for the data module."""
        from lightning.pytorch.cli import _get_module_type

        super()._add_instantiators()
        self._makes_data = True
        self.parser.add_instantiator(self.make_data, _get_module_type(self._datamodule_class),
                                     subclasses=self.subclass_mode_data, prepend=True)

    def make_data(self, class_type: type, *args: Any, applied_instantiation_links: dict,
                  **kwargs: Any) -> Any:
        """The one moment model and data agree: the data module made with what the
        pretrained model sets (:func:`data_with_model`), then the task's class names and
        sizes taken from it and the data checked against the model (:func:`agree`), before
        the task is made. Through LightningCLI's own instantiator (the data arguments it
        stores with the checkpoint)."""
        from lightning.pytorch.cli import _InstantiatorFn

        config = self.config[self.subcommand] if self.subcommand else self.config
        kwargs = data_with_model(config, kwargs)
        datamodule = _InstantiatorFn(cli=self, key="data")(
            class_type, *args, applied_instantiation_links=applied_instantiation_links,
            **kwargs)
        self._agreement = (datamodule, agree(config, datamodule))
        return datamodule

    def agreement(self, datamodule: Any) -> Any:
        """Model and data agreed for ``datamodule`` (:func:`agree`), once per data module:
        both links read the one answer."""
        held = getattr(self, "_agreement", None)
        if held is None or held[0] is not datamodule:
            config = self.config[self.subcommand] if self.subcommand else self.config
            held = (datamodule, agree(config, datamodule))
            self._agreement = held
        return held[1]

    def _agreed_class_names(self, datamodule: Any) -> list[str] | None:
        return self.agreement(datamodule).class_names

    def _agreed_data_sizes(self, datamodule: Any) -> dict[str, int] | None:
        return self.agreement(datamodule).data_sizes

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        """``ckpt_path`` checked before it is read: ``last`` is the newest whole checkpoint
        (a damaged newer one is skipped with a warning), a damaged named file an error
        naming it (:func:`multimodal.cli.callbacks.resume_checkpoint`)."""
        kwargs = super()._prepare_subcommand_kwargs(subcommand)
        if kwargs.get("ckpt_path") is not None:
            kwargs["ckpt_path"] = resume_checkpoint(self.trainer, kwargs["ckpt_path"])
        if kwargs.get("ckpt_path"):  # (test / predict write none: no "dirpath changed")
            continue_in_its_folder(self.trainer, kwargs["ckpt_path"])
        return kwargs

    def _run_subcommand(self, subcommand: str) -> None:
        """LightningCLI's, with an out-of-memory error turned into the one line that names
        the batch size, the model and what to try (:func:`multimodal.cli.faults
        .out_of_memory_message`)."""
        try:
            super()._run_subcommand(subcommand)
        except Exception as err:
            guard = next((c for c in self.trainer.callbacks if isinstance(c, RunGuard)), None)
            died = guard.worker_death_error(self.trainer.global_step) if guard else None
            if died is not None:
                raise died from err
            if not isinstance(err, (RuntimeError, MemoryError)):
                raise
            model = getattr(self.model, "model", self.model)
            params = sum(p.numel() for p in model.parameters()) if model is not None else 0
            name = f"{type(model).__name__}, {params / 1e6:.3g}M parameters"
            message = out_of_memory_message(err, getattr(self.datamodule, "batch_size", None),
                                            name)
            if message is None:
                raise
            raise OutOfMemory(message) from err

    def after_fit(self) -> None:
        if not self.config.fit.get("test_after_fit", True) or self.trainer.fast_dev_run:
            return
        has_test = type(self.datamodule).test_dataloader is not L.LightningDataModule \
            .test_dataloader
        from multimodal.tasks.base import loader_examples

        if has_test and loader_examples(self.datamodule.test_dataloader) == 0:
            rank_zero_info("test after fit: skipped, the data holds no test split (give a "
                           "test file to score the model)")
        elif has_test:
            path, why = self.checkpoint_to_test()
            rank_zero_info(f"test after fit: {path or 'the weights at the end of fit'} ({why})")
            self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=path)

    def checkpoint_to_test(self) -> tuple[str | None, str]:
        """The checkpoint the test after fit reads and why: the best of the run's checkpoint
        callback (with its metric, value and tie rule); ``last.ckpt`` (the latest state)
        when the validation split is too small to rank checkpoints (a
        :class:`~multimodal.cli.callbacks.RunCheckpoint` counted fewer than
        ``min_val_examples``); else the weights in memory."""
        callback = self.trainer.checkpoint_callback
        best = getattr(callback, "best_model_path", "") or None
        if isinstance(callback, RunCheckpoint):
            small = callback.val_examples is not None and \
                0 < callback.val_examples < callback.min_val_examples
            last = callback.last_model_path
            if small and last and Path(last).is_file():
                return last, (f"the latest state: {callback.val_examples} validation examples "
                              f"(< {callback.min_val_examples}) are too few to rank "
                              f"checkpoints by {callback.monitor}")
            if best is not None:
                return best, callback.best_reason()
        if best is None:
            return None, "no best checkpoint: nothing was ranked by a validation metric"
        monitor = getattr(callback, "monitor", None)
        return best, f"the best by {monitor}" if monitor else "the checkpoint callback's best"


_TASK_OF_MODEL = {"ViT": "multimodal.tasks.ClassificationTask",
                  "AudioClassifier": "multimodal.tasks.ClassificationTask",
                  "TextEncoder": "multimodal.tasks.ClassificationTask"}


def _option(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def predict_from_checkpoint(argv: list[str]) -> list[str]:
    """``multimodal predict --ckpt_path X --data.init_args.predict D`` without a config
    (``test`` / ``validate`` likewise):
    the checkpoint knows the task (its class and arguments), the model and class names
    (``pretrained: X``) and the data module's arguments, so they become a config written
    next to nothing the user keeps (a temporary file), prepended to ``argv``. Any other
    argument still overrides it. ``argv`` is returned unchanged when a config is given or
    there is no ``--ckpt_path``."""
    if not argv or argv[0] not in ("predict", "test", "validate") or any(
            a in ("--config", "-c") or a.startswith("--config=") for a in argv):
        return argv
    ckpt_path = _option(argv, "--ckpt_path")
    if ckpt_path is None:
        return argv
    import tempfile

    import yaml

    from multimodal.checkpoints import read_checkpoint
    from multimodal.tasks import stored_task

    ckpt = read_checkpoint(ckpt_path)
    hp = {k: v for k, v in (ckpt.get("hyper_parameters") or {}).items()}
    about = ckpt.get("multimodal_model") or {}
    task = hp.pop("_class_path", None) or _TASK_OF_MODEL.get(about.get("model_type"))
    if task is None:
        raise UsageError(f"{ckpt_path} does not say its task: give --config", "--ckpt_path")
    task, hp = stored_task(task, hp)  # a folded task's checkpoint: today's task
    model_args = {k: v for k, v in hp.items() if not k.startswith("_")}
    model_args.update(pretrained=str(ckpt_path), overrides=None)
    model_args.pop("preset", None)  # the checkpoint holds the architecture
    model_args.pop("init_from", None)  # the checkpoint already holds those weights
    model_args.pop("data_sizes", None)  # linked from the data again
    data_hp = dict(ckpt.get("datamodule_hyper_parameters") or {})
    data_path = data_hp.pop("_class_path", None)
    config: dict[str, Any] = {"model": {"class_path": task, "init_args": model_args}}
    if data_path is not None:
        data_args = {k: v for k, v in data_hp.items() if not k.startswith("_")}
        config["data"] = {"class_path": data_path, "init_args": data_args}
    elif not any(a == "--data" or a.startswith(("--data=", "--data.class_path")) for a in argv):
        raise UsageError(f"{ckpt_path} holds no data module arguments (its data module "
                         "does not call save_hyperparameters): name the data with --config "
                         "or --data CLASS --data.init_args...", "--ckpt_path")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="predict-",
                                     delete=False) as f:
        yaml.safe_dump(config, f)
    rank_zero_info(f"{argv[0]}: task, model, class names and data arguments from {ckpt_path}")
    return [argv[0], "--config", f.name, *argv[1:]]


def check_ckpt_path(ckpt_path: str) -> None:
    """A ``--ckpt_path`` that cannot be a checkpoint is a :class:`UsageError` naming it: a
    folder (with the ``.ckpt`` files it holds, if any), a missing file, a file that is not
    a checkpoint (:func:`multimodal.cli.callbacks.checkpoint_problem`). ``last``, ``best``,
    ``hpc`` and ``registry`` are LightningCLI's names, checked when the run starts."""
    if ckpt_path in ("last", "best", "hpc", "registry"):
        return
    path = Path(ckpt_path)
    if path.is_dir():
        found = sorted(path.glob("*.ckpt")) or sorted(
            [*path.glob("checkpoints/*.ckpt"), *path.glob("version_*/checkpoints/*.ckpt")],
            key=lambda p: p.stat().st_mtime)
        hint = f": give a .ckpt file, e.g. {found[-1]}" if found else \
            " and holds no .ckpt file: give a checkpoint file"
        raise UsageError(f"{path} is a folder, not a checkpoint{hint}", "--ckpt_path")
    if not path.exists():
        raise UsageError(f"checkpoint not found: {path}", "--ckpt_path")
    what = sniff_torch_file(path)
    if what is not None:
        raise UsageError(f"{path} is not a checkpoint: {what}", "--ckpt_path")
    problem = checkpoint_problem(path)
    if problem is not None:
        raise UsageError(f"{path} cannot be read: {problem}", "--ckpt_path")


def _config_task(argv: list[str]) -> str | None:
    """The model class a command line names: ``--model CLASS`` or the last ``--config``
    file's ``model.class_path`` (None when neither says)."""
    named = _option(argv, "--model") or _option(argv, "--model.class_path")
    if named:
        return named
    import yaml

    task = None
    for i, arg in enumerate(argv):
        path = argv[i + 1] if arg in ("--config", "-c") and i + 1 < len(argv) else \
            arg.split("=", 1)[1] if arg.startswith("--config=") else None
        if path is None or not Path(path).is_file():
            continue
        try:
            config = yaml.safe_load(Path(path).read_text()) or {}
        except (yaml.YAMLError, OSError, UnicodeDecodeError):
            continue
        model = config.get("model") if isinstance(config, dict) else None
        if isinstance(model, dict) and model.get("class_path"):
            task = str(model["class_path"])
        elif isinstance(model, str):
            task = model
    return task


def check_checkpoint_task(argv: list[str]) -> None:
    """With a config and a ``--ckpt_path`` file both given, the checkpoint must be of the
    config's task: a :class:`UsageError` naming both otherwise (LightningCLI would take the
    checkpoint's task and fail later on data the task does not read)."""
    ckpt_path, wanted = _option(argv, "--ckpt_path"), _config_task(argv)
    if not ckpt_path or not wanted or not Path(ckpt_path).is_file():
        return
    import torch

    try:
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # an unreadable file is check_ckpt_path's and Lightning's to report
        return
    from multimodal.tasks import stored_task

    saved = (ckpt.get("hyper_parameters") or {}).get("_class_path")
    current = stored_task(str(saved), {})[0] if saved else None
    if current and current.rsplit(".", 1)[-1] != stored_task(wanted, {})[0].rsplit(".", 1)[-1]:
        raise UsageError(f"{ckpt_path} is a checkpoint of {saved}, but the config's model is "
                         f"{wanted}: give that task's config, or no --config (the "
                         "checkpoint names its task)", "--ckpt_path")


ADVERTS = ("\N{ELECTRIC LIGHT BULB} Tip:",)
"""Lightning's info lines that advertise a product (litlogger, litmodels): not printed."""


class _NoAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(ADVERTS)


def quiet_lightning(subcommand: str | None) -> None:
    """What every run printed and nobody acts on, silenced: Lightning's product tips
    (:data:`ADVERTS`, a filter on its rank-zero loggers), torch's ``LeafSpec``
    deprecation raised inside Lightning's own code, and, for ``test`` / ``validate`` /
    ``predict``, the advice to pass the training run's callbacks (early stopping plays no
    part in them). Call inside a ``warnings.catch_warnings()`` block."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoAdverts) for f in logger.filters):
            logger.addFilter(_NoAdverts())
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    if subcommand in ("test", "validate", "predict"):
        warnings.filterwarnings("ignore", message="Be aware that when using `ckpt_path`, "
                                "callbacks used to create the checkpoint")


def run_lightning(argv: list[str]) -> int:
    """``multimodal fit / validate / test / predict ...`` (``argv`` starts with the verb)
    through :class:`MultimodalCLI`. Errors are raised (the caller prints them on one
    line): jsonargparse's as ``argparse.ArgumentError``, not its usage dump and exit."""
    import warnings

    ckpt_path = _option(argv, "--ckpt_path")
    has_config = any(a in ("--config", "-c") or a.startswith("--config=") for a in argv)
    named = any(a.startswith(("--model", "--data")) and "." not in a.split("=")[0][2:]
                for a in argv)
    helping = any(a in ("-h", "--help", "--print_config") or a.startswith("--print_config=")
                  for a in argv)
    if not has_config and not named and not helping and argv and argv[0] in (
            "fit", "validate", "test", "predict") and (argv[0] == "fit" or ckpt_path is None):
        how = "--config CONFIG.yaml (configs/*.yaml)" if argv[0] == "fit" else \
            "--ckpt_path CKPT (the checkpoint names its task and data) or --config CONFIG.yaml"
        raise UsageError(f"multimodal {argv[0]} needs {how}", f"multimodal {argv[0]} --help")
    if ckpt_path is not None:
        check_ckpt_path(ckpt_path)
        check_checkpoint_task(argv)
    argv = predict_from_checkpoint(list(argv))
    quiet = {"exit_on_error": False}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter")
        quiet_lightning(argv[0] if argv else None)
        MultimodalCLI(
            L.LightningModule,
            L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_kwargs={"overwrite": True},
            # not a terminal (a log file, CI): plain epoch lines instead of the redrawn bar
            trainer_defaults={"callbacks": [EpochSummary()],
                              "enable_progress_bar": is_terminal(sys.stdout)},
            parser_kwargs={**quiet, "prog": "multimodal", **{verb: dict(quiet) for verb in
                                       ("fit", "validate", "test", "predict")}},
            args=argv,
            auto_configure_optimizers=False,
        )
    return 0


def main(args: list[str] | None = None) -> None:
    """The ``multimodal`` command (:func:`multimodal.cli.verbs.main`: every verb)."""
    from multimodal.cli.verbs import main as verbs_main

    verbs_main(args)


if __name__ == "__main__":
    main()
