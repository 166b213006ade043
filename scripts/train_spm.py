#!/usr/bin/env python3
"""Train a sentencepiece model and encode the corpus: the ``tupe-train-spm`` command.

``python scripts/train_spm.py ...`` runs :mod:`tupe_plugin.corpus.train_spm` as the command does.
"""

import sys

from tupe_plugin.corpus.train_spm import main

if __name__ == "__main__":
    sys.exit(main())
