"""Modality tokenizers: text (word pieces, words, characters, phonemes), images (patches,
pixel levels), audio (log-mel frames, codec tokens).

Importing the package defines every text-tokenizer kind, so ``load_tokenizer`` finds a saved
tokenizer of any kind by its ``type`` (the phoneme tokenizer subclasses the text ones, so
``text.py`` cannot import it without a cycle).
"""

from multimodal.tokenizers import phonemes as _phonemes  # noqa: F401  (registers "phonemes")
