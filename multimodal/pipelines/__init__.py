"""The verbs over inputs: a model picked from :func:`multimodal.load` run over folders,
manifests, files or texts.

=============  ====================================================================
module         what it runs
=============  ====================================================================
``inputs``     what the verbs read: folders, manifests, lists (one collector, one
               error per unreadable input, ``skip_corrupt``)
``embed``      ``mm.embed`` / ``multimodal embed``: one embedding per input, resumable
``zero_shot``  ``mm.zero_shot`` / ``multimodal zero-shot``: CLIP / SigLIP labels
``caption``    ``mm.caption`` / ``multimodal caption``
``transcribe`` ``mm.transcribe`` / ``multimodal transcribe``: Whisper over audio files
``speak``      ``mm.synthesize`` / ``multimodal speak``: text-to-speech with a CodecLM
``chat``       ``mm.chat``: one chat turn through a tokenizer's chat template
=============  ====================================================================

They sit above the loaders (:mod:`multimodal.loading`, :mod:`multimodal.encoder`; a verb's
own picker of the parts of ``load(path)``, such as ``transcribe.load_transcriber`` or
``speak.load_tts``, sits in its module) and below ``serve`` and ``cli``, which
parse arguments and print. Nothing is imported here: ``import multimodal.pipelines.embed``.
"""
