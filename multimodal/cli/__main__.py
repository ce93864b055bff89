"""``python -m multimodal.cli ...``: the ``multimodal`` command."""

import sys

from multimodal.cli.main import main

if __name__ == "__main__":
    main(sys.argv[1:])
