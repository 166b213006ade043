#!/usr/bin/env python3
"""Build a pre-training corpus: the ``tupe-build-corpus`` command.

``python scripts/build_corpus.py ...`` runs :mod:`tupe_plugin.corpus.build` as the command does.
"""

import sys

from tupe_plugin.corpus.build import main

if __name__ == "__main__":
    sys.exit(main())
