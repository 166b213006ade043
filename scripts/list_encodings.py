#!/usr/bin/env python3
"""List every registered position encoding: the ``tupe-encodings`` command.

``python scripts/list_encodings.py ...`` runs :mod:`tupe_plugin.models.encoding_listing` as the command does.
"""

import sys

from tupe_plugin.models.encoding_listing import main

if __name__ == "__main__":
    sys.exit(main())
