"""``tupe-study CONFIG.yaml --out DIR``: check the config, run the jobs, write the report."""

import argparse
import json
import logging
import os
import signal
import sys

from ..cli.extras import MissingExtraError, require
from . import state
from .config import StudyConfigError, load_config
from .jobs import Tools, build_jobs
from .launchers import make_launcher, pretrain_processes, uses_gpu
from .runner import DONE, run_jobs


def known_archs():
    """The --arch names the plugin registers (importing it registers them with fairseq)."""
    import tupe_plugin  # noqa: F401
    from fairseq.models import ARCH_MODEL_REGISTRY

    logging.getLogger().setLevel(logging.WARNING)  # importing fairseq leaves the root logger at DEBUG
    return {arch for arch, model in ARCH_MODEL_REGISTRY.items()
            if model.__module__.split(".")[0] == "tupe_plugin"}


def resolve_tools(config):
    """The device and the processes per pre-training job the config asks for."""
    device = config["device"]
    if device == "auto":
        if config["launcher"]["name"] == "local":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        else:
            device = "cuda" if uses_gpu(config["launcher"]) else "cpu"
    return Tools(cpu=device == "cpu", distributed_world_size=pretrain_processes(config["launcher"]))


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="tupe-study", description="Compare position encodings: pre-train, fine-tune and analyse "
        "each architecture of CONFIG, then write DIR/report.md, DIR/report.json and DIR/figures/.")
    parser.add_argument("config", metavar="CONFIG.yaml", help="the study's YAML config")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="folder for every job and the report; rerun with the same DIR to resume")
    args = parser.parse_args(argv)
    try:
        require("matplotlib", "study", "tupe-study")
        config = load_config(args.config, known_archs())
        jobs = build_jobs(config, args.out, resolve_tools(config))
        os.makedirs(args.out, exist_ok=True)
        state.lock_study(args.out)
        launcher = make_launcher(config["launcher"], os.path.abspath(args.out))
    except (StudyConfigError, MissingExtraError, state.StudyInUseError) as error:
        parser.error(str(error))
    with open(os.path.join(args.out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
    # A scheduler's SIGTERM ends the study like Ctrl-C: the running job is stopped with it.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    from .report import write_report

    try:
        outcome = run_jobs(jobs, launcher)
    except (KeyboardInterrupt, SystemExit):
        finished = {job.name: (DONE, "done before") for job in jobs if state.is_done(job)}
        paths = write_report(config, jobs, finished, args.out)
        print(f"tupe-study: interrupted; the report of the {len(finished)} finished job(s) is {paths['md']}; "
              "run the same command again to continue", file=sys.stderr)
        raise
    paths = write_report(config, jobs, outcome, args.out)
    print(f"report: {paths['md']}, {paths['json']}, figures in {paths['figures']}")
    with open(paths["json"], encoding="utf-8") as f:  # the outcomes, and the GLUE runs that gave only nan
        statuses = json.load(f)["jobs"]
    failed = {name: job for name, job in statuses.items() if job["status"] != DONE}
    for name, job in failed.items():
        print(f"tupe-study: {name}: {job['status']}: {job['note']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
