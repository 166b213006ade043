#!/usr/bin/env python3
"""Collect the dev scores of GLUE fine-tuning runs: the ``tupe-collect-glue`` command.

``python scripts/collect_glue_scores.py ...`` runs :mod:`tupe_plugin.glue.scores` as the command does.
"""

import sys

from tupe_plugin.glue.scores import main

if __name__ == "__main__":
    sys.exit(main())
