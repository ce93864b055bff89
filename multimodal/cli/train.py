"""``multimodal fit / validate / test / predict``: the verbs that go through LightningCLI
(:class:`multimodal.cli.main.MultimodalCLI`).

``--help`` prints the options people use, without importing Lightning (a second);
``--help_all`` prints LightningCLI's full list (every trainer, task and data option: slow,
it imports every task and data module). ``--model.help CLASS`` / ``--data.help CLASS`` show
one class's options, as in LightningCLI.
"""

from __future__ import annotations

__all__ = ["HELP", "fit", "lightning_verb", "predict", "test", "validate"]

_COMMON = """\
  -c, --config FILE           the run's YAML (configs/*.yaml); every value in it can be
                              overridden below, e.g. --trainer.max_epochs 3
  --ckpt_path PATH            a checkpoint (.ckpt file){ckpt}
  --model.init_args.pretrained PATH
                              start from a pretrained folder or .ckpt
  --data.init_args.train PATH your labelled files: a folder with a subfolder per class,
                              or a manifest (.csv / .jsonl)
  --data.init_args.batch_size N|auto
                              auto (fit): the largest batch whose training step fits in
                              memory, searched before training and stored with the run
  --skip_corrupt true         leave out files that cannot be read (listed) instead of
                              stopping at the first with an error naming it
  --trainer.default_root_dir DIR
                              where the run writes (checkpoints, logs)
  --trainer.accelerator cpu|gpu|auto, --trainer.devices N, --trainer.precision P
  --print_config              print the config after the overrides, and exit
  --debug                     a traceback instead of one error line
  --help_all                  every option (slow: reads every task and data module)
  --model.help CLASS, --data.help CLASS
                              the options of one task / data class"""

HELP: dict[str, tuple[str, str, str]] = {
    "fit": ("multimodal fit --config CONFIG.yaml [--section.key VALUE ...]",
            "Train the model of a config on its data; the checkpoints go to "
            "<default_root_dir>/checkpoints (last.ckpt and the best), and the best is "
            "tested at the end.",
            """\
  --ckpt_path last            resume the interrupted run (the newest whole checkpoint)
  --trainer.max_epochs N, --trainer.max_steps N
  --test_after_fit false      no test at the end
  --monitor METRIC, --monitor_mode max|min
                              what the best checkpoint is chosen by (default: the task's)
  --checkpoint_every_minutes N
                              also save last.ckpt every N minutes
  --on_nonfinite stop|skip    a NaN / infinite loss: stop at the last finite state
                              (default), or skip such steps
  --on_save_error stop|continue
                              a checkpoint that cannot be written (full disk): stop
                              (default), or train on without it"""),
    "validate": ("multimodal validate --ckpt_path CKPT [--config CONFIG.yaml] [...]",
                 "One pass over the validation data with a checkpoint; without --config "
                 "the task, model and data come from the checkpoint.", ""),
    "test": ("multimodal test --ckpt_path CKPT [--config CONFIG.yaml] [...]",
             "Metrics of a checkpoint on the test data; without --config the task, model "
             "and data come from the checkpoint.", ""),
    "predict": ("multimodal predict --ckpt_path CKPT --data.init_args.predict PATH [...]",
                "A checkpoint's predictions for your files, one line each "
                "(file<TAB>class<TAB>probability for a classifier); without --config the "
                "task, model and data come from the checkpoint.",
                """\
  --data.init_args.predict PATH
                              what to predict: a folder of images / audio files, or texts
                              (.txt: one per line, .csv / .jsonl, or a folder of .txt)"""),
}
"""verb -> (usage, description, its own options)."""


def help_text(verb: str) -> str:
    """The text of ``multimodal VERB --help`` for a LightningCLI verb."""
    usage, description, own = HELP[verb]
    ckpt = "" if verb == "fit" else "; the run's best / last with --config: best | last"
    options = "\n".join(part for part in (own, _COMMON.format(ckpt=ckpt)) if part)
    return f"usage: {usage}\n\n{description}\n\noptions:\n{options}\n"


def lightning_verb(verb: str | None, args: list[str]) -> int:
    """Run a LightningCLI verb (``verb`` None: ``args`` hold the verb themselves, after
    LightningCLI's global options); ``--help`` answers without importing Lightning."""
    if verb is not None and any(a in ("-h", "--help") for a in args):
        print(help_text(verb))
        return 0
    args = ["--help" if a == "--help_all" else a for a in args]
    from multimodal.cli.main import run_lightning

    return run_lightning([verb, *args] if verb is not None else list(args))


def fit(args: list[str]) -> int:
    """``multimodal fit``."""
    return lightning_verb("fit", args)


def validate(args: list[str]) -> int:
    """``multimodal validate``."""
    return lightning_verb("validate", args)


def test(args: list[str]) -> int:
    """``multimodal test``."""
    return lightning_verb("test", args)


def predict(args: list[str]) -> int:
    """``multimodal predict``."""
    return lightning_verb("predict", args)
