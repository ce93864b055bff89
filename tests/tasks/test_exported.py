"""Every LightningModule task of the package is reachable as ``multimodal.tasks.X``."""

import importlib
import inspect
import pkgutil

import multimodal.tasks as tasks
from multimodal.tasks.base import ModelTask


def test_every_task_class_is_exported():
    defined = {}
    for info in pkgutil.iter_modules(tasks.__path__):
        module = importlib.import_module(f"multimodal.tasks.{info.name}")
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, ModelTask) \
                    and obj.__module__ == module.__name__:
                defined[name] = obj
    assert "TTSTask" in defined  # the one that was missing
    missing = sorted(set(defined) - set(tasks.__all__))
    assert not missing, f"tasks not in multimodal.tasks._TASKS: {missing}"
    for name, cls in defined.items():
        assert getattr(tasks, name) is cls
