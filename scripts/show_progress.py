#!/usr/bin/env python3
"""Show fairseq-train's progress over the requested updates: the ``tupe-show-progress`` command.

``python scripts/show_progress.py ...`` runs :mod:`tupe_plugin.cli.progress` as the command does.
"""

import sys

from tupe_plugin.cli.progress import main

if __name__ == "__main__":
    sys.exit(main())
