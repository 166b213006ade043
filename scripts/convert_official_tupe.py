#!/usr/bin/env python3
"""Convert the released TUPE-R checkpoint: the ``tupe-convert-official`` command.

``python scripts/convert_official_tupe.py ...`` runs :mod:`tupe_plugin.conversion.cli` as the command does.
"""

import sys

from tupe_plugin.conversion.cli import main

if __name__ == "__main__":
    sys.exit(main())
