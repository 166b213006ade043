"""The jobs of a study: what each runs, in which folder, after which others, and its fingerprint.

Every job runs command-line tools (no import of the plugin's internals): fairseq's and the package's
(``python -m tupe_plugin...``, the modules behind the ``tupe-*`` commands), in the job's folder with
absolute paths. So a job runs the same by hand: its commands are recorded in its folder and in the
report. Folders, under the study's ``--out``::

    data/                   corpus split, sentencepiece model, data-bin (shared by every arch)
    unigram/                the context-free baseline (unigram.json)
    pretrain/ARCH/seedP/           fairseq-train masked LM with seed P: checkpoints/, tensorboard/, train.log
    glue/ARCH/seedP/TASK/lrL/seedS/  tupe-finetune-glue of that model, lr L, seed S: bin/, run/
    squad-data/vV/                 train/dev split of the SQuAD dev articles (when no train file is given)
    squad/ARCH/seedP/vV/seedS/     tupe-finetune-squad, SQuAD vV, seed S: bin/, run/ (predictions, eval.log)
    analysis/ARCH/seedP/           tupe-analyze: analysis/ (PNGs, positions.json)
    extrapolation/ARCH/seedP/lenL/ the validation loss on blocks of L tokens (extrapolation.json); with a
                                   RoPE scaling, lenL-linear4/ and the like

A job's fingerprint hashes the settings it depends on and its dependencies' fingerprints, so a
changed setting invalidates that job and the jobs built on it, and nothing else. The input files
given in the config (corpus, GLUE task files, SQuAD files) enter the settings by the sha256 of their
content: an edited file invalidates the jobs that read it, a touched one does not.
"""

import hashlib
import json
import math
import os
import sys
from dataclasses import dataclass, field

from ..cli.fairseq_tools import PLUGIN_DIR, fairseq_tool
from ..cli.prepared_folder import file_digest
from ..glue.tasks import GLUE_TASKS

@dataclass
class Job:
    name: str                      # also its folder under --out, e.g. "glue/tupe_r_tiny/RTE/seed1"
    kind: str                      # data, unigram, pretrain, glue, squad-data, squad, analysis, extrapolation
    folder: str
    commands: list                 # argv lists, run in order in its folder
    deps: list = field(default_factory=list)     # names of the jobs it needs
    settings: dict = field(default_factory=dict)  # what its outputs depend on
    resumable: bool = False        # a rerun continues in the same folder instead of starting afresh
    outputs: list = field(default_factory=list)  # files later jobs read: a done job without one reruns
    log: str = "log.txt"           # the output of its commands, in its folder
    model: "Model" = None          # the pre-trained model the job trains or reads
    fingerprint: str = ""




@dataclass(frozen=True)
class Tools:
    """Where the commands come from: the Python and fairseq-* of this environment, the device."""

    python: str = sys.executable
    bin_dir: str = os.path.dirname(sys.executable)
    cpu: bool = True
    distributed_world_size: int = 1  # processes of one pre-training job (SLURM tasks)

    def fairseq(self, tool):
        return fairseq_tool(tool, self.bin_dir)


@dataclass(frozen=True)
class Model:
    """A pre-trained model the later jobs read: ``arch`` pre-trained with ``seed``, its last checkpoint
    or (``at``) the one kept at that update (``pretrain.evaluate_at``), or the last of ``stage``."""

    arch: str
    seed: int
    at: int = None
    stage: int = None

    @property
    def key(self):
        """Its part of a job's name: ``ARCH/seedP`` or ``ARCH/seedP/atU``."""
        return f"{self.arch}/seed{self.seed}" + ("" if self.at is None else f"/at{self.at}")

    @property
    def pretrain_job(self):
        return f"pretrain/{self.arch}/seed{self.seed}"

    def checkpoint(self, out):
        if self.stage is not None:
            return os.path.join(out, self.pretrain_job, stage_dir(self.stage), "checkpoint_last.pt")
        folder = os.path.join(out, self.pretrain_job, "checkpoints")
        return os.path.join(folder, "checkpoint_last.pt" if self.at is None else snapshot_name(self.at))


def stage_dir(stage):
    """The --save-dir of a stage before the last (the last stage's is ``checkpoints``)."""
    return f"stage{stage}"


def stage_offsets(pretrain):
    """``{--save-dir folder name: updates of the stages before it}``: each stage counts from 0."""
    if not pretrain["stages"]:
        return {}
    ends = [0] + pretrain["evaluate_at"]
    names = [stage_dir(number) for number in range(1, len(ends))] + ["checkpoints"]
    return dict(zip(names, ends))


def along_models(pretrain, model):
    """The models of ``model``'s pre-training that are evaluated along it: the checkpoints of
    ``evaluate_at``, or each stage's end but the last."""
    if pretrain["stages"]:
        return [Model(model.arch, model.seed, at, stage)
                for stage, at in enumerate(pretrain["evaluate_at"], 1)]
    return [Model(model.arch, model.seed, at) for at in pretrain["evaluate_at"]]


def snapshot_name(update):
    """The name :mod:`.snapshots` gives the checkpoint kept at ``update``."""
    return f"checkpoint_at{update}.pt"


def data_bin(out):
    return os.path.join(out, "data", "data-bin")


def build_jobs(config, out, tools=Tools()):
    """The jobs of ``config``, each after its dependencies."""
    out = os.path.abspath(out)
    jobs = [_data_job(config, out, tools), _unigram_job(out, tools)]
    squad = config["squad"]
    if squad is not None:
        jobs += [_squad_split_job(squad, version, out, tools) for version in squad["versions"]
                 if squad["files"][version]["train"] is None]
    # Pre-training and analysis of every arch first: the loss curves against the baseline and the
    # position analysis are the comparison's core, and a stopped study reports them for all archs.
    pretrain = config["pretrain"]
    final = [Model(arch, seed) for seed in pretrain["seeds"] for arch in config["archs"]]
    # the checkpoints along pre-training get the evaluations of the final models but extrapolation
    models = final + [along for model in final for along in along_models(pretrain, model)]
    jobs += [_pretrain_job(pretrain, model, out, tools) for model in final]
    if config["analysis"]:
        jobs += [_analysis_job(model, out, tools) for model in models]
    if config["extrapolation"] is not None:
        extrapolation = config["extrapolation"]
        jobs += [_extrapolation_job(extrapolation, model, length, scaling, out, tools)
                 for model in final for length in extrapolation["lengths"]
                 for scaling in [None, *extrapolation["rotary_scalings"]]]
    glue = config["glue"]
    if glue is not None:
        for task in glue["tasks"]:
            files = GLUE_TASKS[task].files(glue["dir"])
            digests = {split: file_digest(path) for split, path in files.items()}
            jobs += [_glue_job(glue, model, task, digests, lr, run_seed, out, tools)
                     for run_seed in glue["seeds"] for lr in glue["lrs"] for model in models]
    if squad is not None:
        jobs += [_squad_job(squad, model, version, run_seed, out, tools) for version in squad["versions"]
                 for run_seed in squad["seeds"] for model in models]
    by_name = {}
    for job in jobs:
        job.fingerprint = _fingerprint(job, by_name)
        by_name[job.name] = job
    return jobs


def _fingerprint(job, by_name):
    payload = {"kind": job.kind, "settings": job.settings,
               "deps": [by_name[dep].fingerprint for dep in job.deps]}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def _job(out, name, kind, commands, **kwargs):
    return Job(name=name, kind=kind, folder=os.path.join(out, name), commands=commands, **kwargs)


def _data_job(config, out, tools):
    """tupe-build-corpus -> tupe-train-spm -> fairseq-preprocess, as examples/demo.sh does."""
    folder = os.path.join(out, "data")
    corpus = config["corpus"]
    # lines short enough for the shortest stage: --sample-break-mode complete keeps whole lines
    tokens = min(stage["tokens_per_sample"] for stage in config["pretrain"]["stages"] or [config["pretrain"]])
    spm, data = os.path.join(folder, "spm"), data_bin(out)
    commands = [
        [tools.python, "-m", "tupe_plugin.corpus.build", "--output-dir", os.path.join(folder, "corpus")]
        + (["--corpus", corpus] if corpus else []),
        [tools.python, "-m", "tupe_plugin.corpus.train_spm", "--corpus-dir", os.path.join(folder, "corpus"),
         "--output-dir", spm, "--vocab-size", str(config["data"]["vocab_size"]),
         "--max-pieces", str(tokens - 2)],
        [tools.fairseq("preprocess"), "--only-source", "--trainpref", os.path.join(spm, "train.bpe"),
         "--validpref", os.path.join(spm, "valid.bpe"), "--testpref", os.path.join(spm, "test.bpe"),
         "--srcdict", os.path.join(spm, "dict.txt"),  # every piece: fine-tuning text gets no <unk>
         "--destdir", data, "--workers", "2"],
        # the hub loader and the fine-tuning scripts look for the sentencepiece model here
        ["cp", os.path.join(spm, "spm.model"), os.path.join(data, "sentencepiece.bpe.model")],
    ]
    source = ({"corpus": corpus, "sha256": file_digest(corpus)} if corpus
              else {"corpus": "python standard-library docstrings", "python": sys.version.split()[0]})
    settings = {**source, "vocab_size": config["data"]["vocab_size"], "tokens_per_sample": tokens}
    return _job(out, "data", "data", commands, settings=settings,
                outputs=[os.path.join(data, "dict.txt")])


def _unigram_job(out, tools):
    spm = os.path.join(out, "data", "spm")
    commands = [[tools.python, "-m", "tupe_plugin.study.unigram",
                 "--train", os.path.join(spm, "train.bpe"), "--valid", os.path.join(spm, "valid.bpe"),
                 "--dict", os.path.join(data_bin(out), "dict.txt"),
                 "--out", os.path.join(out, "unigram", "unigram.json")]]
    return _job(out, "unigram", "unigram", commands, deps=["data"])


def pretrain_schedule(pretrain, updates=None):
    """Warm-up, validation/checkpoint interval and log interval of a pre-training run (of ``updates``,
    by default the whole run's)."""
    updates = pretrain["updates"] if updates is None else updates
    warmup = pretrain["warmup_updates"]
    interval = pretrain["validate_every"] or max(1, updates // 10)
    return {"warmup": updates // 10 if warmup is None else warmup, "interval": interval,
            "log_interval": max(1, min(interval, 10))}


def _pretrain_job(pretrain, model, out, tools):
    """fairseq-train of ``model``. With ``evaluate_at``, the checkpoints of those updates are kept
    (``--keep-interval-updates-pattern``) and named for the jobs that read them (:mod:`.snapshots`).
    With ``init_from``, the first fairseq-train starts from that checkpoint's words and layers with this
    architecture's position encoding (``--init-from-checkpoint``: Wang et al.'s protocol, the unswapped
    architecture continued as the control). With ``stages``, one fairseq-train per stage in its own
    ``--save-dir``, each started from the previous stage's last checkpoint (``--finetune-from-model``: a
    fresh optimizer and schedule for the new length; a rerun resumes the stage it stopped in), learned
    tables sized for the last length."""
    folder = os.path.join(out, model.pretrain_job)
    stages = pretrain["stages"] or [{"tokens_per_sample": pretrain["tokens_per_sample"],
                                     "updates": pretrain["updates"]}]
    commands, start = [], None
    for number, stage in enumerate(stages, 1):
        last = number == len(stages)
        save_dir = os.path.join(folder, "checkpoints" if last else stage_dir(number))
        command = _fairseq_train(pretrain, model, stage, save_dir, out, tools)
        if len(stages) > 1:
            command += ["--max-positions", str(pretrain["tokens_per_sample"]),
                        "--tensorboard-logdir", os.path.join(folder, "tensorboard", f"stage{number}")]
        else:
            command += ["--tensorboard-logdir", os.path.join(folder, "tensorboard")]
        if start:
            command += ["--finetune-from-model", start]
        elif pretrain["init_from"]:  # the words and layers of a pre-trained model, this arch's encoding
            command += ["--init-from-checkpoint", pretrain["init_from"]]
        kept = [] if pretrain["stages"] else pretrain["evaluate_at"]
        if kept:  # the checkpoints at multiples of the updates' gcd survive --keep-interval-updates 1
            command += ["--keep-interval-updates-pattern", str(math.gcd(*kept))]
        commands.append(command + pretrain["extra_args"])
        if kept:
            commands.append([tools.python, "-m", "tupe_plugin.study.snapshots", "--save-dir", save_dir,
                             "--at", *map(str, kept)])
        start = os.path.join(save_dir, "checkpoint_last.pt")
    settings = {"arch": model.arch, "seed": model.seed,
                **{k: v for k, v in pretrain.items() if k != "seeds"}}
    if pretrain["init_from"]:
        settings["init_from_sha256"] = file_digest(pretrain["init_from"])
    return _job(out, model.pretrain_job, "pretrain", commands, deps=["data"], settings=settings,
                resumable=True, log="train.log", model=model,
                outputs=[model.checkpoint(out)] + [m.checkpoint(out) for m in along_models(pretrain, model)])


def _fairseq_train(pretrain, model, stage, save_dir, out, tools):
    """The masked-LM fairseq-train command of one stage (the whole run without stages)."""
    schedule = pretrain_schedule(pretrain, stage["updates"])
    command = [
        tools.fairseq("train"), data_bin(out), "--user-dir", PLUGIN_DIR,
        "--task", "masked_lm", "--criterion", "masked_lm", "--arch", model.arch,
        "--sample-break-mode", "complete", "--tokens-per-sample", str(stage["tokens_per_sample"]),
        "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-6", "--clip-norm", "1.0",
        "--lr", str(pretrain["lr"]), "--lr-scheduler", "polynomial_decay",
        "--warmup-updates", str(schedule["warmup"]), "--total-num-update", str(stage["updates"]),
        "--max-update", str(stage["updates"]), "--batch-size", str(pretrain["batch_size"]),
        "--log-format", "simple", "--log-interval", str(schedule["log_interval"]),
        "--save-dir", save_dir,
        "--no-epoch-checkpoints", "--save-interval-updates", str(schedule["interval"]),
        "--keep-interval-updates", "1", "--validate-interval-updates", str(schedule["interval"]),
        "--seed", str(model.seed), "--num-workers", "0",
    ]
    if tools.cpu:
        command.append("--cpu")
    if tools.distributed_world_size > 1:
        command += ["--distributed-world-size", str(tools.distributed_world_size),
                    "--distributed-port", "29671"]
    return command


def _finetuning_flags(tools, settings, **flags):
    """The fine-tuning tool's flags: those given a value, --cpu on CPU, the study's extra_args last."""
    argv = [item for flag, value in flags.items() if value is not None
            for item in (f"--{flag.replace('_', '-')}", str(value))]
    return argv + (["--cpu"] if tools.cpu else []) + settings["extra_args"]


def glue_run_name(model, task, lr, run_seed):
    return f"glue/{model.key}/{task}/lr{lr}/seed{run_seed}"


def _glue_job(glue, model, task, digests, lr, run_seed, out, tools):
    """Fine-tune ``model`` on ``task`` with learning rate ``lr`` and ``run_seed``; ``digests`` are the
    sha256 of the task's files, by split."""
    name = glue_run_name(model, task, lr, run_seed)
    folder = os.path.join(out, name)
    command = [tools.python, "-m", "tupe_plugin.glue.finetune", task, model.checkpoint(out),
               data_bin(out), *_finetuning_flags(
                   tools, glue, glue_dir=glue["dir"], bin_dir=os.path.join(folder, "bin"),
                   save_dir=os.path.join(folder, "run"), seed=run_seed, lr=lr,
                   max_epoch=glue["max_epoch"], batch_size=glue["batch_size"],
                   max_examples=glue["max_examples"])]
    settings = {key: glue[key] for key in ("dir", "max_examples", "max_epoch", "batch_size", "extra_args")}
    return _job(out, name, "glue", [command], deps=[model.pretrain_job],
                settings={"task": task, "seed": run_seed, "lr": lr, "sha256": digests, **settings},
                model=model)


def _squad_split_job(squad, version, out, tools):
    dev = squad["files"][version]["dev"]
    command = [tools.python, "-m", "tupe_plugin.study.squad_split", "--dev", dev,
               "--dev-every", str(squad["dev_every"]),
               "--out", os.path.join(out, "squad-data", f"v{version}")]
    if squad["max_articles"]:
        command += ["--max-articles", str(squad["max_articles"])]
    settings = {"dev": dev, "sha256": file_digest(dev), "dev_every": squad["dev_every"],
                "max_articles": squad["max_articles"]}
    return _job(out, f"squad-data/v{version}", "squad-data", [command], settings=settings)


def squad_files(squad, version, out):
    """The (train, dev) SQuAD JSON files the fine-tuning jobs of ``version`` read."""
    files = squad["files"][version]
    if files["train"] is None:
        folder = os.path.join(out, "squad-data", f"v{version}")
        return os.path.join(folder, "train.json"), os.path.join(folder, "dev.json")
    return files["train"], files["dev"]


def squad_run_name(model, version, run_seed):
    return f"squad/{model.key}/v{version}/seed{run_seed}"


def _squad_job(squad, model, version, run_seed, out, tools):
    name = squad_run_name(model, version, run_seed)
    folder = os.path.join(out, name)
    train, dev = squad_files(squad, version, out)
    given = squad["files"][version]["train"] is not None
    # the tool fits the stride and the question length to the window (tupe-prepare-squad's defaults)
    command = [tools.python, "-m", "tupe_plugin.squad.finetune", version,
               model.checkpoint(out), data_bin(out), *_finetuning_flags(
                   tools, squad, train_file=train, valid_file=dev, bin_dir=os.path.join(folder, "bin"),
                   save_dir=os.path.join(folder, "run"), seed=run_seed, lr=squad["lr"],
                   max_epoch=squad["max_epoch"], batch_size=squad["batch_size"],
                   max_seq_length=squad["max_seq_length"],
                   max_articles=squad["max_articles"] if given else None)]
    deps = [model.pretrain_job] + ([] if given else [f"squad-data/v{version}"])
    settings = {key: squad[key] for key in ("lr", "max_epoch", "batch_size", "max_seq_length", "extra_args",
                                            "max_articles", "dev_every")}
    settings.update(version=version, seed=run_seed, train=train, dev=dev)
    if given:
        settings.update(train_sha256=file_digest(train), dev_sha256=file_digest(dev))
    return _job(out, name, "squad", [command], deps=deps, settings=settings, model=model)


def _analysis_job(model, out, tools):
    name = f"analysis/{model.key}"
    command = [tools.python, "-m", "tupe_plugin.analysis.cli", "--path", model.checkpoint(out),
               "--data", data_bin(out), "--out", os.path.join(out, name, "analysis"),
               "--device", "cpu" if tools.cpu else "cuda"]
    return _job(out, name, "analysis", [command], deps=[model.pretrain_job], model=model)


def scaling_name(scaling):
    """``linear4``: a RoPE scaling's part of a job name (None: the unscaled model's)."""
    return None if scaling is None else f"{scaling['scaling']}{scaling['factor']:g}"


def extrapolation_name(model, length, scaling=None):
    return f"extrapolation/{model.key}/len{length}" + (f"-{scaling_name(scaling)}" if scaling else "")


def _extrapolation_job(extrapolation, model, length, scaling, out, tools):
    """The validation loss of ``model`` on blocks of ``length`` tokens (with RoPE ``scaling``)."""
    name = extrapolation_name(model, length, scaling)
    command = [tools.python, "-m", "tupe_plugin.study.extrapolation",
               "--path", model.checkpoint(out), "--data", data_bin(out),
               "--length", str(length), "--batch-size", str(extrapolation["batch_size"]),
               "--out", os.path.join(out, name, "extrapolation.json")]
    if scaling:
        command += ["--rotary-scaling", scaling["scaling"],
                    "--rotary-scaling-factor", str(scaling["factor"])]
    if tools.cpu:
        command.append("--cpu")
    return _job(out, name, "extrapolation", [command], deps=[model.pretrain_job],
                settings={"length": length, "batch_size": extrapolation["batch_size"],
                          "rotary_scaling": scaling},
                model=model)
