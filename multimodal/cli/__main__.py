"""``python -m multimodal.cli ...``: the ``multimodal`` command."""

from multimodal.cli.verbs import main

if __name__ == "__main__":
    main()
