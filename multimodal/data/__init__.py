"""Data, organised by what each piece is.

One LightningDataModule per task family, each taking any source of its kind:
``vision`` (image classification), ``pixels`` (raw pixels for ImageGPT), ``audio`` (sound
classification), ``text`` (language modelling, source classification),
``text_classification`` (your labelled texts), ``text_pairs`` (your text pairs, seq2seq),
``captions``
(image-caption pairs), ``numbers`` (number words -> digits, generated), ``tts`` (phonemes +
an acoustic prompt -> codec tokens, for text-to-speech). They share the
loader recipe of ``splits`` (with ``sampling``'s resumable shuffle).

Built-in sources, one module each: ``sources/`` (how each dataset is obtained offline and
read; ``emoji`` and ``scenes`` are the caption sources). Generic readers of your own files:
``readers`` (class folders, manifests, image decoding), ``audio_files`` (labelled recordings),
``caption_files`` (caption manifests, COCO JSON), ``text_files`` (.txt / JSONL text),
``text_labelled`` (``text,label`` CSV / JSONL, class folders of .txt, ``source,target`` pairs),
``text_tokenizer`` (a Hugging Face or own ``tokenizer.json`` and its special ids),
``shards`` (LitData). Items and batches: ``images``, ``audio_datasets``, ``documents``.
Per-modality transforms: ``transforms`` (images), ``audio_transforms`` and ``noise`` (audio).
"""
