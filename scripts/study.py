#!/usr/bin/env python3
"""Compare position encodings in one command: corpus -> pre-training -> GLUE / SQuAD -> analysis -> report.

    python scripts/study.py examples/study-tiny.yaml --out study-tiny

Writes DIR/report.md, DIR/report.json and DIR/figures/; every job runs in its own folder under DIR
and records its completion, so rerunning the same command redoes nothing finished and resumes an
interrupted pre-training. docs/study.md describes the config.
"""

import sys

from tupe_plugin.study.cli import main

if __name__ == "__main__":
    sys.exit(main())
