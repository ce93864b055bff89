"""Entry points: the ``multimodal`` command (:mod:`~.main`: fit / validate / test / predict
through LightningCLI, and the ``speak`` and ``transcribe`` verbs), its ``embed`` /
``zero-shot`` / ``caption`` verbs (:mod:`~.inference`), ``multimodal-prepare``
(:mod:`~.prepare`: your own data -> streaming shards), the Lightning callbacks every
run gets (:mod:`~.callbacks`) and the run's precision choice (:mod:`~.precision`).
``python -m multimodal.cli`` runs the ``multimodal`` command.
"""
