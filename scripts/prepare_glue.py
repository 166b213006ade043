#!/usr/bin/env python3
"""Encode and binarize one GLUE task: the ``tupe-prepare-glue`` command.

``python scripts/prepare_glue.py ...`` runs :mod:`tupe_plugin.glue.prepare` as the command does.
"""

import sys

from tupe_plugin.glue.prepare import main

if __name__ == "__main__":
    sys.exit(main())
