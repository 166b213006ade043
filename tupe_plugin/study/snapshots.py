"""The checkpoints of a pre-training kept at ``pretrain.evaluate_at``, under names later jobs can give.

fairseq-train names an interval checkpoint ``checkpoint_EPOCH_UPDATES.pt``, and the epoch of an update
is known only once it is written. After the pre-training, ``python -m tupe_plugin.study.snapshots
--save-dir DIR --at 1000 2000`` links each ``checkpoint_*_U.pt`` as ``checkpoint_atU.pt`` (a hard link:
no copy, and deleting one name keeps the other). A missing one stops with the update and the fix.
"""

import argparse
import glob
import os
import sys

from .jobs import snapshot_name


def keep(save_dir, update):
    """Link fairseq's checkpoint of ``update`` in ``save_dir`` as :func:`snapshot_name`; its path."""
    found = sorted(glob.glob(os.path.join(save_dir, f"checkpoint_*_{update}.pt")))
    if not found:
        raise FileNotFoundError(f"{save_dir} has no checkpoint of update {update} "
                                f"(checkpoint_*_{update}.pt): it must be a multiple of "
                                "pretrain.validate_every, and no later than pretrain.updates")
    target = os.path.join(save_dir, snapshot_name(update))
    if os.path.exists(target):
        os.remove(target)
    os.link(found[-1], target)
    return target


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--save-dir", required=True, help="fairseq-train's --save-dir")
    parser.add_argument("--at", type=int, nargs="+", required=True, help="the updates to keep")
    args = parser.parse_args(argv)
    try:
        for update in args.at:
            print(f"kept update {update}: {keep(args.save_dir, update)}")
    except FileNotFoundError as error:
        sys.exit(f"snapshots: error: {error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
