"""Entry points: the ``multimodal`` command (:mod:`~.verbs`: one table of verbs, each
imported when it runs; :mod:`~.train`: fit / validate / test / predict through LightningCLI,
:mod:`~.main`; :mod:`~.inference`: embed / zero-shot / caption / transcribe / speak), its
one-line errors (:mod:`~.errors`) and shared flags (:mod:`~.flags`), ``multimodal-prepare``
(:mod:`~.prepare`: your own data -> streaming shards), the Lightning callbacks every run gets
(:mod:`~.callbacks`) and the run's precision choice (:mod:`~.precision`).
``python -m multimodal.cli`` runs the ``multimodal`` command.
"""
