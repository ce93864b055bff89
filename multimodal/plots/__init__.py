"""Figures: shared matplotlib helpers and the confusion matrix (:mod:`~.figures`), and the
figure-drawing entry points for checkpoints, ``python -m multimodal.plots.pixels <ckpt>``
(ImageGPT samples and completions) and ``python -m multimodal.plots.attention <ckpt>``
(captions and cross-attention maps)."""
