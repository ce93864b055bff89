"""Built-in data sources: how each dataset is obtained offline and read, one module each.

Images: :mod:`~.fashion_mnist`, :mod:`~.mnist5k`, :mod:`~.digits` (each with its
:class:`~multimodal.data.images.ImageSource`). The recipes that fetch or make the offline
copies are in the repository's ``data/`` folder (``bash data/get.sh all``). A source knows
no task and no data module; the data module of a task family (``data/vision.py``,
``data/audio.py``, ``data/text.py``, ``data/captions.py``) takes any source of its kind.
"""
