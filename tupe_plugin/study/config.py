"""The study's YAML config: defaults, and checks that stop a bad config before any training.

Every error names the key (``glue.tasks[1]``) or the file, says what is wrong and how to fix it.
Relative paths are taken from the current folder; ``glue`` and ``squad`` run only when present
(their keys default as in :data:`DEFAULTS`, but for their data, ``glue.dir`` and ``squad.dev``, which
they must give); an omitted ``corpus`` is the demo's embedded corpus (the docstrings of the Python
standard library, ``tupe-build-corpus``).
"""

import copy
import difflib
import math
import os

from omegaconf.errors import OmegaConfBaseException

from ..glue.tasks import GLUE_TASKS
from ..user_input.path_checks import path_problem
from .yaml_file import YamlFileError, read_mapping

GET_GLUE = ("get the GLUE data with the GLUE benchmark's download script (download_glue_data.py, linked "
            "from gluebenchmark.com)")
GET_SQUAD = "get the official files from rajpurkar.github.io/SQuAD-explorer"


class Required:
    """The default of a key the config must give; ``hint`` (what to give) ends the error."""

    def __init__(self, hint):
        self.hint = hint

    def __deepcopy__(self, memo):
        return self


# The schema: every key the config may have, with its default. A nested dict is a section;
# The optional sections (glue, squad) run only when the config has them; null or omitted skips them.
DEFAULTS = {
    "corpus": None,
    "device": "auto",
    "archs": Required("the --arch names to compare, e.g. [bert_a_tiny, tupe_r_tiny]"),
    "data": {"vocab_size": 8000},
    "pretrain": {
        "updates": 1000, "tokens_per_sample": 128, "batch_size": 16, "lr": 5e-4,
        "warmup_updates": None, "seeds": [1], "validate_every": None, "evaluate_at": [], "stages": None,
        "init_from": None, "extra_args": [],
    },
    "glue": {
        "dir": Required("the folder of the GLUE data, one folder per task (RTE/train.tsv, RTE/dev.tsv, ...); "
                        f"{GET_GLUE}; or set glue: null to skip GLUE"),
        "tasks": ["CoLA", "SST-2", "MRPC", "STS-B", "RTE"], "max_examples": None,
        "max_epoch": None, "seeds": [1, 2, 3], "lrs": [2e-5], "select": "median", "checkpoint": "best",
        "batch_size": 32, "extra_args": [],
    },
    "squad": {
        "versions": ["1.1"], "train": None,
        "dev": Required(f"the SQuAD dev file (dev-v1.1.json or dev-v2.0.json; a path with {{version}} for "
                        f"several versions); {GET_SQUAD}; or set squad: null to skip SQuAD"),
        "max_articles": None, "dev_every": 5, "max_epoch": 2, "seeds": [1], "lr": 3e-5,
        "batch_size": 32, "max_seq_length": None, "extra_args": [],
    },
    "extrapolation": {"lengths": [64, 128, 256, 512], "batch_size": 8, "rotary_scalings": []},
    "analysis": True,
    "report": {"min_margin_bits": 1.0, "plateau_bits": 1.0, "reference": None},
    "launcher": {"name": "local"},
}
OPTIONAL_SECTIONS = ("glue", "squad", "extrapolation")
LAUNCHERS = ("local", "submitit")
SUBMITIT_CLUSTERS = ("slurm", "local", "debug")
DEVICES = ("auto", "cpu", "cuda")
SQUAD_VERSIONS = ("1.1", "2.0")
GLUE_SELECT = ("median", "mean")      # how each task's learning rate is chosen from glue.lrs, over seeds
GLUE_CHECKPOINTS = ("best", "last")   # a run's score: its best evaluation, or its last (Wang et al.)


class StudyConfigError(ValueError):
    """A config the study cannot run; the message names the key or file and the fix."""


def load_config(path, known_archs):
    """The checked config of ``path`` as a plain dict, defaults filled in, paths absolute.

    ``known_archs`` are the ``--arch`` names the study may pre-train.
    """
    if problem := path_problem(path):
        raise StudyConfigError(f"{path}: {problem}; give the study's YAML config file")
    try:
        raw = read_mapping(path, "archs: [bert_a_tiny, tupe_r_tiny]")
    except YamlFileError as error:
        raise StudyConfigError(str(error)) from None
    except (OmegaConfBaseException, UnicodeDecodeError) as error:
        raise StudyConfigError(f"{path}: not a readable YAML file: {error}") from error
    return check_config(raw, known_archs, source=path)


def check_config(raw, known_archs, source="config"):
    """Validate a config dict (as read from YAML); returns it with defaults and absolute paths."""
    if not isinstance(raw, dict):
        raise StudyConfigError(f"{source}: the top level must be a mapping of keys (archs, pretrain, ...)")
    fail = _failer(source)
    _check_finite(raw, "", fail)
    config = _merge(raw, DEFAULTS, "", fail)

    archs = config["archs"]
    if not isinstance(archs, list) or not archs:
        fail("archs", "must be a non-empty list of --arch names, e.g. [bert_a_tiny, tupe_r_tiny]")
    for i, arch in enumerate(archs):
        if arch not in known_archs:
            fail(f"archs[{i}]", f"unknown architecture {arch!r}{_suggest(arch, known_archs)}")
    if len(set(archs)) != len(archs):
        fail("archs", "lists an architecture twice")

    if config["device"] not in DEVICES:
        fail("device", f"must be one of {', '.join(DEVICES)}, got {config['device']!r}")
    config["corpus"] = _check_corpus(config["corpus"], fail)
    _positive_int(config["data"], "data", "vocab_size", fail, least=8)

    pretrain = config["pretrain"]
    if pretrain["stages"] is not None:
        _check_stages(pretrain, raw.get("pretrain") or {}, fail)
    for key in ("updates", "tokens_per_sample", "batch_size"):
        _positive_int(pretrain, "pretrain", key, fail)
    _seed_list(pretrain, "pretrain", fail)
    if pretrain["tokens_per_sample"] < 8:
        fail("pretrain.tokens_per_sample", "must be at least 8")
    for key in ("warmup_updates", "validate_every"):
        if pretrain[key] is not None:
            _positive_int(pretrain, "pretrain", key, fail, least=0 if key == "warmup_updates" else 1)
    _positive_float(pretrain, "pretrain", "lr", fail)
    _string_list(pretrain, "pretrain", "extra_args", fail)
    if pretrain["init_from"] is not None:
        pretrain["init_from"] = _existing_file(
            pretrain["init_from"], "pretrain.init_from", fail,
            "a pre-trained checkpoint (a plugin or fairseq RoBERTa model.pt, or tupe-convert-hf's) whose "
            "words and layers every architecture starts from")
    if pretrain["stages"] is None:
        _check_evaluate_at(pretrain, fail)

    if config["glue"] is not None:
        _check_glue(config["glue"], fail)
    if config["squad"] is not None:
        _check_squad(config["squad"], fail)
    if config["extrapolation"] is not None:
        _check_extrapolation(config["extrapolation"], fail)
    if not isinstance(config["analysis"], bool):
        fail("analysis", f"must be true or false, got {config['analysis']!r}")
    _positive_float(config["report"], "report", "min_margin_bits", fail)
    _positive_float(config["report"], "report", "plateau_bits", fail)
    reference = config["report"]["reference"]
    if reference is None:
        config["report"]["reference"] = archs[0]
    elif reference not in archs:
        fail("report.reference", f"{reference!r} is not one of archs ({', '.join(archs)})")
    _check_launcher(config["launcher"], fail)
    return config


def _failer(source):
    def fail(key, message):
        raise StudyConfigError(f"{source}: key '{key}': {message}")
    return fail


def _suggest(name, known):
    close = difflib.get_close_matches(str(name), list(known), n=3, cutoff=0.6)
    return f"; did you mean {', '.join(close)}?" if close else f" (known: {', '.join(sorted(known))})"


def _merge(raw, defaults, prefix, fail):
    """``defaults`` overridden by ``raw``; unknown keys and wrong shapes stop with their name."""
    merged = copy.deepcopy(defaults)
    for key, value in raw.items():
        name = f"{prefix}{key}"
        if key not in defaults:
            if prefix == "launcher.":  # executor parameters, checked by the launcher
                merged[key] = value
                continue
            fail(name, f"unknown key{_suggest(key, defaults)}")
        default = defaults[key]
        if isinstance(default, dict):
            if value is None and prefix + key in OPTIONAL_SECTIONS:
                merged[key] = None
            elif isinstance(value, dict):
                merged[key] = _merge(value, default, f"{name}.", fail)
            else:
                fail(name, f"must be a mapping of keys ({', '.join(default)})"
                     + (" or null to skip it" if prefix + key in OPTIONAL_SECTIONS else ""))
        else:
            merged[key] = value
    if not prefix:
        for key in OPTIONAL_SECTIONS:
            if key not in raw:
                merged[key] = None
    for key, value in merged.items():
        if isinstance(value, Required):
            fail(f"{prefix}{key}", f"is required: {value.hint}")
    return merged


def _check_finite(node, name, fail):
    """Refuse NaN and the infinities (YAML's .nan, .inf) wherever the config holds a number: no setting
    takes one, and a NaN compares false with every bound (report.plateau_bits: .nan put no run on a plateau
    and wrote a bare NaN into report.json)."""
    if isinstance(node, dict):
        for key, value in node.items():
            _check_finite(value, f"{name}.{key}" if name else str(key), fail)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_finite(value, f"{name}[{i}]", fail)
    elif isinstance(node, float) and not math.isfinite(node):
        fail(name, f"must be a finite number, got {node!r}: write a number (YAML's .nan and .inf are none)")


def _positive_int(section, prefix, key, fail, least=1):
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        fail(f"{prefix}.{key}", f"must be a whole number of at least {least}, got {value!r}")


def _positive_float(section, prefix, key, fail):
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        fail(f"{prefix}.{key}", f"must be a positive number, got {value!r}")


def _string_list(section, prefix, key, fail):
    value = section[key]
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
        fail(f"{prefix}.{key}", f"must be a list of command-line arguments, got {value!r}")
    section[key] = [str(v) for v in value]


def _existing_file(path, key, fail, what):
    if not isinstance(path, str):
        fail(key, f"must be the path of {what}, got {path!r}")
    absolute = os.path.abspath(path)
    if problem := path_problem(absolute):
        fail(key, f"{absolute}: {problem}; give the path of {what}")
    return absolute


def _check_corpus(corpus, fail):
    """The corpus path, absolute; a file that is not UTF-8 text stops with the byte offset."""
    if corpus is None:
        return None
    path = _existing_file(corpus, "corpus", fail, "a UTF-8 text file (one paragraph a line)")
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        fail("corpus", f"{path}: not UTF-8 text (byte {error.start}: {data[error.start:error.start + 1]!r});"
             " convert it, e.g. iconv -f latin1 -t utf-8")
    if not text.strip():
        fail("corpus", f"{path}: the file is empty")
    return path


def _check_glue(glue, fail):
    glue_dir = glue["dir"]
    if problem := path_problem(glue_dir, "folder") if isinstance(glue_dir, str) else "not a path":
        fail("glue.dir", f"{os.path.abspath(str(glue_dir))}: {problem}; give the folder holding "
             f"the GLUE tasks (TASK/train.tsv, TASK/dev.tsv), {GET_GLUE}; or set glue: null to skip GLUE")
    glue["dir"] = os.path.abspath(glue_dir)
    tasks = glue["tasks"]
    if not isinstance(tasks, list) or not tasks:
        fail("glue.tasks", f"must be a non-empty list of GLUE tasks ({', '.join(GLUE_TASKS)})")
    for i, task in enumerate(tasks):
        if task not in GLUE_TASKS:
            fail(f"glue.tasks[{i}]", f"unknown GLUE task {task!r}{_suggest(task, GLUE_TASKS)}")
        folder = os.path.join(glue["dir"], GLUE_TASKS[task].folder)
        if problem := path_problem(folder, "folder"):
            fail(f"glue.tasks[{i}]", f"{folder}: {problem}: glue.dir has no "
                 f"GLUE task {task}; {GET_GLUE}, or remove {task} from glue.tasks")
        for path in GLUE_TASKS[task].files(glue["dir"]).values():
            if problem := path_problem(path):
                fail(f"glue.tasks[{i}]", f"{path}: {problem}: the GLUE task {task} needs its "
                     f"{os.path.basename(path)}; {GET_GLUE}")
    if len(set(tasks)) != len(tasks):
        fail("glue.tasks", "lists a task twice")
    _seed_list(glue, "glue", fail)
    if glue["max_examples"] is not None:
        _positive_int(glue, "glue", "max_examples", fail)
    if glue["max_epoch"] is not None:  # null: each task's epochs (TUPE: 10, 5 for MNLI, QNLI, QQP)
        _positive_int(glue, "glue", "max_epoch", fail)
    _positive_int(glue, "glue", "batch_size", fail)
    lrs = glue["lrs"]
    if (not isinstance(lrs, list) or not lrs or len(set(lrs)) != len(lrs) or not all(
            isinstance(lr, (int, float)) and not isinstance(lr, bool) and lr > 0 for lr in lrs)):
        fail("glue.lrs", f"must be a non-empty list of distinct positive learning rates, got {lrs!r}")
    for key, choices in (("select", GLUE_SELECT), ("checkpoint", GLUE_CHECKPOINTS)):
        if glue[key] not in choices:
            fail(f"glue.{key}", f"must be one of {', '.join(choices)}, got {glue[key]!r}")
    _string_list(glue, "glue", "extra_args", fail)


def _check_stages(pretrain, raw_pretrain, fail):
    """Staged sequence lengths (Wang et al.'s 128 then 512 tokens): the stages give the updates and the
    lengths; ``pretrain.updates`` becomes their sum and ``tokens_per_sample`` the last stage's."""
    stages = pretrain["stages"]
    if not isinstance(stages, list) or len(stages) < 2 or not all(
            isinstance(stage, dict) and set(stage) == {"tokens_per_sample", "updates"} for stage in stages):
        fail("pretrain.stages", "must be a list of at least two {tokens_per_sample: N, updates: N} stages, "
             f"e.g. [{{tokens_per_sample: 128, updates: 900}}, {{tokens_per_sample: 512, updates: 100}}]; "
             f"got {stages!r}")
    for i, stage in enumerate(stages):
        for key in ("tokens_per_sample", "updates"):
            least = 8 if key == "tokens_per_sample" else 1
            _positive_int(stage, f"pretrain.stages[{i}]", key, fail, least=least)
        if i and stage["tokens_per_sample"] < stages[i - 1]["tokens_per_sample"]:
            before = stages[i - 1]["tokens_per_sample"]
            fail(f"pretrain.stages[{i}].tokens_per_sample", f"{stage['tokens_per_sample']} is shorter than "
                 f"pretrain.stages[{i - 1}]'s {before}: the model's positions are sized for the last stage's "
                 "length, so the lengths may only grow; order the stages from short to long")
    given = [key for key in ("updates", "tokens_per_sample", "evaluate_at") if key in raw_pretrain]
    if given:
        fail(f"pretrain.{given[0]}", "is given by pretrain.stages (the updates add up, the last stage's "
             "length is the model's, and each stage's end is evaluated): drop it")
    pretrain["updates"] = sum(stage["updates"] for stage in stages)
    pretrain["tokens_per_sample"] = stages[-1]["tokens_per_sample"]
    pretrain["evaluate_at"] = stage_ends(pretrain)


def stage_ends(pretrain):
    """The updates at which a stage other than the last ends (each evaluated along pre-training)."""
    ends, total = [], 0
    for stage in (pretrain["stages"] or [])[:-1]:
        total += stage["updates"]
        ends.append(total)
    return ends


def _check_evaluate_at(pretrain, fail):
    """The updates whose checkpoints are evaluated too: saved ones (multiples of the validation
    interval), before the last (the final model, always evaluated, may be listed and is dropped)."""
    from .jobs import pretrain_schedule

    updates, at = pretrain["updates"], pretrain["evaluate_at"]
    if (not isinstance(at, list) or len(set(at)) != len(at)
            or not all(isinstance(u, int) and not isinstance(u, bool) and 0 < u <= updates for u in at)):
        fail("pretrain.evaluate_at", f"must be a list of distinct updates from 1 to pretrain.updates "
             f"({updates}), got {at!r}")
    interval = pretrain_schedule(pretrain)["interval"]
    for i, update in enumerate(at):
        if update % interval and update != updates:
            fail(f"pretrain.evaluate_at[{i}]", f"{update} is not a multiple of the checkpoint interval "
                 f"{interval} (pretrain.validate_every): no checkpoint is saved there")
    pretrain["evaluate_at"] = sorted(update for update in at if update != updates)


def _seed_list(section, prefix, fail):
    seeds = section["seeds"]
    if (not isinstance(seeds, list) or not seeds or len(set(seeds)) != len(seeds)
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
        fail(f"{prefix}.seeds", f"must be a non-empty list of distinct whole numbers, got {seeds!r}")


def _check_extrapolation(extrapolation, fail):
    lengths = extrapolation["lengths"]
    if (not isinstance(lengths, list) or not lengths or len(set(lengths)) != len(lengths)
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 8 for n in lengths)):
        fail("extrapolation.lengths", f"must be a non-empty list of distinct lengths of at least 8 tokens, "
             f"got {lengths!r}")
    _positive_int(extrapolation, "extrapolation", "batch_size", fail)
    scalings = extrapolation["rotary_scalings"]
    if not isinstance(scalings, list) or not all(
            isinstance(s, dict) and set(s) == {"scaling", "factor"} and s["scaling"] in ("linear", "ntk")
            and isinstance(s["factor"], (int, float)) and not isinstance(s["factor"], bool)
            and s["factor"] > 1
            for s in scalings):
        fail("extrapolation.rotary_scalings", "must be a list of {scaling: linear or ntk, factor: F > 1}, "
             f"e.g. [{{scaling: linear, factor: 4}}]; got {scalings!r}")


def _check_squad(squad, fail):
    versions = squad["versions"]
    if not isinstance(versions, list) or not versions or len(set(map(str, versions))) != len(versions):
        fail("squad.versions", f"must be a non-empty list of SQuAD versions ({', '.join(SQUAD_VERSIONS)}), "
             f"got {versions!r}")
    squad["versions"] = [str(version) for version in versions]
    for i, version in enumerate(squad["versions"]):
        if version not in SQUAD_VERSIONS:
            fail(f"squad.versions[{i}]", f"must be one of {', '.join(SQUAD_VERSIONS)}, got {version!r}")
    _seed_list(squad, "squad", fail)
    squad["files"] = {}
    for version in squad["versions"]:
        files = {}
        for key, what in (("dev", "dev-v{version}.json"),
                          ("train", "train-v{version}.json, or null to split dev")):
            path = squad[key]
            if path is None:
                files[key] = None
                continue
            if len(squad["versions"]) > 1 and "{version}" not in str(path):
                fail(f"squad.{key}", f"names one file for the versions {squad['versions']}: give a path with "
                     "{version}, e.g. squad/" + f"{key}-v{{version}}.json")
            files[key] = _existing_file(str(path).replace("{version}", version), f"squad.{key}", fail,
                                        f"a SQuAD JSON file ({what.format(version=version)}); {GET_SQUAD}")
        squad["files"][version] = files
    for key in ("max_articles", "max_seq_length"):
        if squad[key] is not None:
            _positive_int(squad, "squad", key, fail, least=2 if key == "max_articles" else 16)
    _positive_int(squad, "squad", "dev_every", fail, least=2)
    for key in ("max_epoch", "batch_size"):
        _positive_int(squad, "squad", key, fail)
    _positive_float(squad, "squad", "lr", fail)
    _string_list(squad, "squad", "extra_args", fail)


def _check_launcher(launcher, fail):
    name = launcher.get("name")
    if name not in LAUNCHERS:
        fail("launcher.name", f"must be one of {', '.join(LAUNCHERS)}, got {name!r}")
    if name == "local" and set(launcher) != {"name"}:
        extra = sorted(set(launcher) - {"name"})
        fail(f"launcher.{extra[0]}", "the local launcher takes no parameters; use name: submitit for "
             "executor parameters")
    if name == "submitit":
        cluster = launcher.setdefault("cluster", "slurm")
        if cluster not in SUBMITIT_CLUSTERS:
            fail("launcher.cluster", f"must be one of {', '.join(SUBMITIT_CLUSTERS)}, got {cluster!r}")
        pretrain = launcher.setdefault("pretrain", {})
        if not isinstance(pretrain, dict):
            fail("launcher.pretrain", "must be a mapping of executor parameters for pre-training jobs "
                 "(e.g. {nodes: 1, tasks_per_node: 8, gpus_per_node: 8})")
