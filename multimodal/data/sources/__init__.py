"""Built-in data sources: how each dataset is obtained offline and read, one module each.

Images: :mod:`~.fashion_mnist`, :mod:`~.mnist5k`, :mod:`~.digits` (each with its
:class:`~multimodal.data.vision_datasets.ImageSource`). Audio: :mod:`~.spoken_words`
(synthesised by the engines of :mod:`~.speech`), :mod:`~.sonic_pi`. English text: :mod:`~.bible`,
:mod:`~.fortunes`, :mod:`~.shakespeare`, by name through :mod:`~.corpora`. Captions:
:mod:`~.emoji` (Twitter emoji pictures with their Unicode names) and :mod:`~.scenes`
(procedural shape scenes with captions).

The recipes that fetch or make the offline copies are in the repository's ``data/`` folder
(``bash data/get.sh all``). A source knows no task and no data module; the data module of a
task family (``data/vision.py``, ``data/audio.py``, ``data/text.py``, ``data/captions.py``)
takes any source of its kind.
"""

GET_AUDIO = (
    "Get it with `bash data/get_audio.sh` (installs the Debian packages espeak-ng, flite and "
    "sonic-pi-samples, then synthesises the spoken words with "
    "`python -m multimodal.cli.datasets spoken-words`)."
)

GET_TEXT = "bash data/get_text.sh"
