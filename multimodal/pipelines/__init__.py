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

Each verb takes a model path or what :func:`multimodal.load` returned for it. They sit above
the loaders (:mod:`multimodal.loading`, :mod:`multimodal.encoder`; the one picker per kind
of model of the parts of ``load(path)``, which ``serve`` and ``cli`` use too, is internal:
``_loaders``) and below ``serve`` and ``cli``, which parse arguments and print. Nothing is
imported here: ``import multimodal.pipelines.embed``.
"""
