"""Data, organised by role.

Data modules, one LightningDataModule per task family, each taking the built-in sources of
its kind and your own files (``train`` / ``val`` / ``test`` / ``shards``; held-out
``val_size`` / ``test_size``: a count or a fraction): ``vision`` (image classification),
``pixels`` (raw pixels for ImageGPT), ``audio`` (sound classification), ``text`` (language
modelling, source classification), ``text_classification`` (your labelled texts),
``text_pairs`` (your text pairs, seq2seq), ``captions`` (image-caption pairs), ``numbers``
(number words -> digits, generated), ``tts`` (phonemes + an acoustic prompt -> codec
tokens). Every one declares ``contract`` (modality, class names, the model sizes it fixes,
what it takes from a pretrained model) and shares the loader recipe of ``splits`` (with
``sampling``'s resumable shuffle).

Built-in sources, one module each: ``sources/`` (how each dataset is obtained offline and
read). Readers of your own files: the package ``readers/`` (``file_lists``: class
folders, manifests; ``audio``: labelled recordings; ``captions``: caption manifests, COCO
JSON; ``text``: .txt / JSONL text; images are decoded by :func:`multimodal.files.read_image`;
the old modules ``audio_files`` / ``captions_files`` / ``text_files`` warn and forward for
one release), ``text_labelled`` (``text,label`` CSV / JSONL, class
folders of .txt, ``source,target`` pairs, texts to predict), ``text_tokenizer`` (a Hugging
Face or own ``tokenizer.json`` and its special ids), ``shards`` (LitData). Items and
batches: ``vision_datasets``, ``audio_datasets``, ``documents``. Per-modality transforms:
``vision_transforms`` (images), ``audio_transforms`` and ``noise`` (audio).
"""
