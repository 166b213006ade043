#!/usr/bin/env python3
"""Write a checkpoint's token embedding as word2vec text: the ``tupe-export-embeddings`` command.

``python scripts/export_embeddings.py ...`` runs :mod:`tupe_plugin.analysis.export_embeddings` as the
command does.
"""

import sys

from tupe_plugin.analysis.export_embeddings import main

if __name__ == "__main__":
    sys.exit(main())
