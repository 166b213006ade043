#!/usr/bin/env python3
"""What the position encodings learned, as figures and metrics: the ``tupe-analyze`` command.

``python scripts/analyze_positions.py ...`` runs :mod:`tupe_plugin.analysis.cli` as the command does.
"""

import sys

from tupe_plugin.analysis.cli import main

if __name__ == "__main__":
    sys.exit(main())
