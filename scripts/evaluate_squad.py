#!/usr/bin/env python3
"""Evaluate a squad_span checkpoint on SQuAD: the ``tupe-evaluate-squad`` command.

``python scripts/evaluate_squad.py ...`` runs :mod:`tupe_plugin.squad.evaluate` as the command does.
"""

import sys

from tupe_plugin.squad.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
