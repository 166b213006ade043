#!/usr/bin/env python3
"""Encode the official SQuAD JSON into features: the ``tupe-prepare-squad`` command.

``python scripts/prepare_squad.py ...`` runs :mod:`tupe_plugin.squad.prepare` as the command does.
"""

import sys

from tupe_plugin.squad.prepare import main

if __name__ == "__main__":
    sys.exit(main())
