"""The fairseq commands of this environment and the plugin's ``--user-dir``.

The tools run ``fairseq-train`` / ``fairseq-validate`` from the folder of the running Python (the same
virtual environment, whether activated or not; else the one on ``PATH``), with ``--user-dir`` the folder
of this package, in a checkout or installed.
"""

import os
import sys

PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fairseq_tool(tool, bin_dir=None):
    """``fairseq-TOOL`` beside ``bin_dir`` (default: the running Python's folder), else the one on PATH."""
    beside = os.path.join(bin_dir or os.path.dirname(sys.executable), f"fairseq-{tool}")
    return beside if os.path.isfile(beside) else f"fairseq-{tool}"
