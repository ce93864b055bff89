"""LightningModules: the training logic, kept apart from the models."""

from multimodal.tasks.classification import ClassificationTask

__all__ = ["ClassificationTask"]
