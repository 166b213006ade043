"""``SAVE_DIR/run.json``, the record of a fine-tuning run: its task, arch and the settings it trained with.

``tupe-finetune-glue`` and ``tupe-finetune-squad`` write it once fairseq-train starts training a new run
(a command refused before that writes none), and read it before a rerun writes anything: a ``--save-dir``
holding a run (its ``checkpoint_last.pt``) is resumed only by the same task with the same settings and
the same data (a fingerprint of the encoded task data, checked on the data prepared aside, before they
replace ``--bin-dir``), so the record always describes the model beside it. A folder without a record is
judged by the fairseq task its checkpoint was trained on.
"""

import hashlib
import json
import os

from ..cli.prepared_folder import MANIFEST, file_digest

RECORD = "run.json"
LAST = "checkpoint_last.pt"

# Files of a prepared folder that are no task data: the preparation's manifest, and fairseq-preprocess's log
# (it names the folder it wrote, so the same data prepared again elsewhere would give another fingerprint)
NOT_DATA = (MANIFEST, "preprocess.log")

# fairseq-train flags that change what is logged or how batches are loaded, not what is trained
MAY_CHANGE_ON_RESUME = ("--log-interval", "--log-format", "--log-file", "--num-workers",
                        "--tensorboard-logdir", "--no-progress-bar")


def read_record(save_dir):
    """The record of ``save_dir``, or None when it has none."""
    path = os.path.join(save_dir, RECORD)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_record(save_dir, record):
    """Write ``record`` as ``save_dir``'s, whole or not at all."""
    path = os.path.join(save_dir, RECORD)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(record, f)
        f.write("\n")
    os.replace(path + ".tmp", path)


def holds_run(save_dir):
    return os.path.isfile(os.path.join(save_dir, LAST))


def rerun_conflict(save_dir, record, fairseq_task):
    """Why a command with ``record`` (its task, arch and settings; fairseq task ``fairseq_task``) may not
    run in ``save_dir``, which would resume the run there; None when it may."""
    if not holds_run(save_dir):
        return None
    saved = read_record(save_dir)
    if saved is None:
        trained_on = saved_fairseq_task(os.path.join(save_dir, LAST))
        if trained_on in (None, fairseq_task):
            return None
        return (f"--save-dir {save_dir} holds a run of fairseq's {trained_on} task (its {LAST}; no "
                f"{RECORD}), which this {record['task']} run ({fairseq_task}) would resume: give another "
                "--save-dir")
    if saved.get("task") != record["task"]:
        return (f"--save-dir {save_dir} holds a fine-tuning run of {saved.get('task')} ({RECORD}, {LAST}), "
                f"which this {record['task']} run would resume and relabel: give another --save-dir")
    if conflict := data_conflict(save_dir, saved, record):
        return conflict
    changes = setting_changes(saved, record)
    if not changes:
        return None
    epochs = any(change.startswith("--max-epoch ") for change in changes)
    return (f"--save-dir {save_dir} holds a {record['task']} run trained with other settings than this "
            f"command's: {'; '.join(changes)}. A rerun resumes the run from its {LAST}: rerun with its "
            "settings, or give another --save-dir to start a new run"
            + (" (the learning rate decays to 0 over the epochs a run is given: more cannot be added)"
               if epochs else ""))


def setting_changes(saved, record):
    """The settings of ``record`` that differ from those the ``saved`` record holds, each as
    ``FLAG NEW (the run: OLD)``; a setting an older record lacks is not compared."""
    changes = []
    for key, value in record.items():
        if key in ("task", "metric", "data") or key not in saved:
            continue
        if key == "fairseq_args":
            changes += [f"fairseq-train {change}" for change in flag_changes(saved[key], value)]
        elif not _same(key, saved[key], value):
            changes.append(f"{_flag(key)} {_shown(value)} (the run: {_shown(saved[key])})")
    return changes


def data_fingerprint(folder):
    """A short hash of the encoded task data in ``folder`` (every file but :data:`NOT_DATA`, by relative path
    and content): other examples, labels or encodings give another, the same prepared again the same."""
    digest = hashlib.sha256()
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            if name not in NOT_DATA:
                digest.update(f"{os.path.relpath(path, folder)}\0{file_digest(path)}\n".encode("utf-8"))
    return digest.hexdigest()[:16]


def recorded_data(folder, source):
    """What ``record['data']`` holds: the :func:`data_fingerprint` of ``folder`` and the flags that chose the
    data (``source``, for messages)."""
    return {"fingerprint": data_fingerprint(folder), "source": source}


def data_conflict(save_dir, saved, record):
    """Why ``record``'s data may not resume the run ``saved`` records (trained on other data); None when
    they are the run's, or either record has no data yet (before preparing; a record older than the
    fingerprint)."""
    run, this = saved.get("data"), record.get("data")
    if not run or not this or run["fingerprint"] == this["fingerprint"]:
        return None
    return (f"--save-dir {save_dir} holds a {record['task']} run trained on other data than this command's: "
            f"the run's, from {run['source']}, have fingerprint {run['fingerprint']} ({RECORD}); this "
            f"command's, from {this['source']}, {this['fingerprint']}. A rerun resumes the run from its "
            f"{LAST}: rerun with the run's data, or give another --save-dir to start a new run")


def flag_changes(saved_args, args):
    """The fairseq-train flags of ``args`` that differ from ``saved_args``, as ``FLAG NEW (the run: OLD)``."""
    saved, given = flag_values(saved_args), flag_values(args)
    return [f"{flag} {_shown(given.get(flag))} (the run: {_shown(saved.get(flag))})"
            for flag in sorted(set(saved) | set(given))
            if flag not in MAY_CHANGE_ON_RESUME and saved.get(flag) != given.get(flag)]


def flag_values(args):
    """``{flag: its value}`` of a command line (the last of a repeated flag; "" for a switch)."""
    values, flag = {}, None
    for token in args:
        if token.startswith("--"):
            flag, _, value = token.partition("=")
            values[flag] = value
        elif flag is not None:
            values[flag] = f"{values[flag]} {token}".strip()
    return values


def saved_fairseq_task(path):
    """The fairseq task (``cfg.task._name``) the checkpoint ``path`` was trained on; None if it names none."""
    from ..checkpoints.checkpoint_config import saved_state

    task = (saved_state(path).get("cfg") or {}).get("task") or {}
    return task.get("_name")


def _same(key, saved, value):
    if key == "checkpoint":
        return os.path.realpath(saved) == os.path.realpath(value)
    try:
        return float(saved) == float(value)
    except (TypeError, ValueError):
        return saved == value


def _flag(key):
    return {"checkpoint": "CKPT", "arch": "arch (of CKPT)"}.get(key, f"--{key.replace('_', '-')}")


def _shown(value):
    return "not given" if value is None else "given" if value == "" else str(value)
