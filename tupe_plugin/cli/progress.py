"""Pass fairseq-train's log through and show progress over the updates requested, not the epoch.

    fairseq-train ... --max-update 400 --log-format simple 2>&1 | \\
        tupe-show-progress --total 400 [--log train.log] [--label NAME]

Every line of the input goes to ``--log`` (or to stdout). Each ``num_updates=N`` (or ``num_updates N``)
it sees gives a progress line on stderr: ``[NAME] update N/TOTAL (P%), elapsed M:SS, ETA M:SS`` —
rewritten in place on a terminal, one line per new report otherwise. fairseq's own tqdm bar counts the
batches of the current epoch, which says little when ``--max-update`` ends training mid-epoch.
"""

import argparse
import re
import sys
import time

UPDATES = re.compile(r"num_updates[= ](\d+)")


def clock(seconds):
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return (f"{hours}:" if hours else "") + f"{rest // 60:{'02' if hours else ''}d}:{rest % 60:02d}"


def progress_line(updates, total, elapsed, label=""):
    """``[label] update N/TOTAL (P%), elapsed ..., ETA ...`` (ETA from the mean time per update so far)."""
    updates = min(updates, total)
    eta = elapsed / updates * (total - updates) if updates else None
    return (f"{f'[{label}] ' if label else ''}update {updates}/{total} ({100 * updates // total}%), "
            f"elapsed {clock(elapsed)}, ETA {clock(eta) if eta is not None else '?'}")


def follow(lines, total, out, err, label="", now=time.monotonic, interactive=False):
    """Copy ``lines`` to ``out``; write a progress line to ``err`` for every new update count."""
    start, last = now(), -1
    for line in lines:
        out.write(line)
        out.flush()
        found = UPDATES.findall(line)
        if not found or int(found[-1]) == last:
            continue
        last = int(found[-1])
        text = progress_line(last, total, now() - start, label)
        err.write(f"\r{text}\033[K" if interactive else text + "\n")
        err.flush()
    if interactive and last >= 0:
        err.write("\n")
    return last


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total", type=int, required=True, help="the --max-update of the run")
    parser.add_argument("--log", help="write the input here instead of stdout")
    parser.add_argument("--label", default="", help="name shown before the progress")
    args = parser.parse_args(argv)
    if args.total < 1:
        parser.error(f"--total must be at least 1, got {args.total}")
    out = open(args.log, "w", encoding="utf-8") if args.log else sys.stdout
    try:
        follow(sys.stdin, args.total, out, sys.stderr, args.label, interactive=sys.stderr.isatty())
    finally:
        if args.log:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
