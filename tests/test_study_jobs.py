"""The study's bookkeeping: which jobs a config makes, what a changed setting invalidates, what a rerun
skips, resumes or redoes, and how a failure spreads."""

import copy
import io
import os
import shutil
import sys
import time

import pytest

from tupe_plugin.study import state
from tupe_plugin.study.config import StudyConfigError, check_config
from tupe_plugin.study.jobs import Job, Model, build_jobs
from tupe_plugin.study.launchers import LocalLauncher
from tupe_plugin.study.runner import DONE, FAILED, SKIPPED, run_jobs

from conftest import test_data

ARCHS = {"bert_a_tiny", "tupe_r_tiny"}


def run_local(jobs, stream):
    """run_jobs on this machine, looking at the running jobs every 0.05 s (the command's 2 s suits real
    jobs)."""
    return run_jobs(jobs, LocalLauncher(), stream=stream, sleep=lambda _: time.sleep(0.05))


@pytest.fixture
def config():
    return check_config({"archs": ["bert_a_tiny", "tupe_r_tiny"],
                         "glue": {"dir": test_data("glue"), "tasks": ["RTE", "MRPC"],
                                  "seeds": [1, 2]}}, ARCHS)


def fingerprints(config, out):
    return {job.name: job.fingerprint for job in build_jobs(config, out)}


def changed(before, after):
    return {name for name in after if before.get(name) != after[name]}


def test_jobs_of_a_config_come_after_their_dependencies(config, tmp_path):
    jobs = build_jobs(config, tmp_path)
    names = [job.name for job in jobs]
    assert len(names) == 2 + 2 * (1 + 2 * 2 + 1)  # data, unigram; per arch: pretrain, 4 GLUE runs, analysis
    assert "glue/tupe_r_tiny/seed1/RTE/lr2e-05/seed2" in names and "pretrain/tupe_r_tiny/seed1" in names
    for index, job in enumerate(jobs):
        assert all(names.index(dep) < index for dep in job.deps), job.name


def test_changed_glue_setting_invalidates_only_glue_jobs(config, tmp_path):
    before = fingerprints(config, tmp_path)
    config["glue"]["max_epoch"] = 7
    assert changed(before, fingerprints(config, tmp_path)) == {n for n in before if n.startswith("glue/")}


def test_changed_pretraining_setting_invalidates_what_depends_on_the_checkpoints(config, tmp_path):
    before = fingerprints(config, tmp_path)
    config["pretrain"]["updates"] = 7
    assert changed(before, fingerprints(config, tmp_path)) == {
        n for n in before if n.split("/")[0] in ("pretrain", "glue", "analysis")}


def test_added_seed_adds_jobs_and_changes_none(config, tmp_path):
    before = fingerprints(config, tmp_path)
    bigger = copy.deepcopy(config)
    bigger["glue"]["seeds"] = [1, 2, 3]
    after = fingerprints(bigger, tmp_path)
    assert changed(before, after) == {f"glue/{a}/seed1/{t}/lr2e-05/seed3"
                                      for a in ARCHS for t in ("RTE", "MRPC")}


def test_added_pretraining_seed_adds_that_models_jobs_and_changes_none(config, tmp_path):
    before = fingerprints(config, tmp_path)
    bigger = copy.deepcopy(config)
    bigger["pretrain"]["seeds"] = [1, 2]
    after = fingerprints(bigger, tmp_path)
    added = {name for name in after if name.split("/")[2:3] == ["seed2"]}
    assert changed(before, after) == added and len(added) == len(before) - 2  # all but data and unigram


def test_added_extrapolation_length_adds_only_its_jobs(config, tmp_path):
    config["extrapolation"] = {"lengths": [64, 128], "batch_size": 8, "rotary_scalings": []}
    before = fingerprints(config, tmp_path)
    config["extrapolation"]["lengths"] = [64, 128, 256]
    added = {f"extrapolation/{a}/seed1/len256" for a in ARCHS}
    assert changed(before, fingerprints(config, tmp_path)) == added


def test_edited_glue_task_file_invalidates_only_that_tasks_jobs(config, tmp_path):
    glue_dir = tmp_path / "glue"
    shutil.copytree(config["glue"]["dir"], glue_dir)
    config["glue"]["dir"] = str(glue_dir)
    before = fingerprints(config, tmp_path)
    dev = glue_dir / "RTE" / "dev.tsv"
    os.utime(dev, (0, 0))  # a touched file, same content: nothing to redo
    assert changed(before, fingerprints(config, tmp_path)) == set()
    dev.write_text(dev.read_text(encoding="utf-8").replace("Dana Reeve", "Dana Reeves"), encoding="utf-8")
    assert changed(before, fingerprints(config, tmp_path)) == {n for n in before if n.startswith("glue/")
                                                               and n.split("/")[3] == "RTE"}


def test_device_is_not_part_of_the_fingerprint(config, tmp_path):
    from tupe_plugin.study.jobs import Tools

    assert fingerprints(config, tmp_path) == {
        job.name: job.fingerprint for job in build_jobs(config, tmp_path, Tools(cpu=False))}


def toy_job(tmp_path, name, code, deps=(), resumable=False):
    job = Job(name=name, kind=name.split("/")[0], folder=str(tmp_path / name),
              commands=[[sys.executable, "-c", code]], deps=list(deps), resumable=resumable,
              fingerprint=f"fp-{name}")
    return job


def test_done_job_with_the_same_fingerprint_is_skipped(tmp_path):
    job = toy_job(tmp_path, "a", "pass")
    state.start(job, state.FRESH, None)
    state.finish(job, 0, 1.0)
    assert state.action(job, state.read_record(job.folder)) == state.SKIP


def test_interrupted_resumable_job_resumes_in_its_folder(tmp_path):
    job = toy_job(tmp_path, "pretrain", "pass", resumable=True)
    state.start(job, state.FRESH, None)
    (tmp_path / "pretrain" / "checkpoint_last.pt").write_text("kept")
    record = state.read_record(job.folder)
    assert state.action(job, record) == state.RESUME
    state.start(job, state.RESUME, record)
    assert (tmp_path / "pretrain" / "checkpoint_last.pt").read_text() == "kept"
    assert state.read_record(job.folder)["attempts"] == 2


def test_done_job_whose_output_is_gone_runs_again_and_says_why(tmp_path):
    job = toy_job(tmp_path, "pretrain", "pass", resumable=True)
    job.outputs = [str(tmp_path / "pretrain" / "checkpoint_last.pt")]
    assert run_local([job], stream=io.StringIO())["pretrain"][0] == DONE
    assert state.action(job, state.read_record(job.folder)) == state.RESUME
    rerun = io.StringIO()
    run_local([job], stream=rerun)
    assert f"pretrain: resuming again: done before, but {job.outputs[0]} is gone" in rerun.getvalue()
    assert state.read_record(job.folder)["attempts"] == 2


def test_interrupted_job_that_cannot_resume_starts_afresh_in_an_empty_folder(tmp_path):
    job = toy_job(tmp_path, "glue", "pass")
    state.start(job, state.FRESH, None)
    (tmp_path / "glue" / "half-written").write_text("stale")
    assert state.action(job, state.read_record(job.folder)) == state.FRESH
    state.start(job, state.FRESH, None)
    assert os.listdir(tmp_path / "glue") == [state.RECORD]


def test_done_job_with_another_fingerprint_is_redone(tmp_path):
    job = toy_job(tmp_path, "a", "pass")
    state.start(job, state.FRESH, None)
    state.finish(job, 0, 1.0)
    job.fingerprint = "changed"
    assert state.action(job, state.read_record(job.folder)) == state.FRESH


def test_failed_job_skips_its_dependents_and_the_others_still_run(tmp_path):
    jobs = [toy_job(tmp_path, "base", "pass"),
            toy_job(tmp_path, "bad", "import sys; print('boom'); sys.exit(3)", deps=["base"]),
            toy_job(tmp_path, "after-bad", "pass", deps=["bad"]),
            toy_job(tmp_path, "other", "pass", deps=["base"])]
    progress = io.StringIO()
    outcome = run_local(jobs, stream=progress)
    assert {name: status for name, (status, _) in outcome.items()} == {
        "base": DONE, "bad": FAILED, "after-bad": SKIPPED, "other": DONE}
    log = tmp_path / "bad" / "log.txt"
    assert f"log: {log}" in outcome["bad"][1] and "exit status 3" in outcome["bad"][1]
    assert "boom" in log.read_text()
    assert f"bad: FAILED (exit status 3: boom; log: {log})" in progress.getvalue()  # the log's last line


def test_rerun_runs_nothing_that_is_done(tmp_path):
    marker = tmp_path / "runs.txt"
    code = f"open({str(marker)!r}, 'a').write('x')"
    jobs = [toy_job(tmp_path, "a", code), toy_job(tmp_path, "b", code, deps=["a"])]
    run_local(jobs, stream=io.StringIO())
    progress = io.StringIO()
    outcome = run_local(jobs, stream=progress)
    assert marker.read_text() == "xx"
    assert all(note == "done before" for _, note in outcome.values())
    assert "[2/2 jobs" in progress.getvalue() and "2 job(s) already done, 0 to run" in progress.getvalue()


def test_pretraining_plans_the_updates_and_tokens_of_each_stage(config, tmp_path):
    from tupe_plugin.study.jobs import Training

    config = check_config({"archs": ["tupe_r_tiny"], "pretrain": {"stages": [
        {"tokens_per_sample": 64, "updates": 30}, {"tokens_per_sample": 128, "updates": 10}]}}, ARCHS)
    pretrain = next(job for job in build_jobs(config, tmp_path) if job.kind == "pretrain")
    assert pretrain.training == {0: Training(30, 16 * 64), 1: Training(10, 16 * 128)}
    assert pretrain.work == 30 * 16 * 64 + 10 * 16 * 128


@pytest.mark.parametrize("max_examples, updates", [(None, 2 * 10), (32, 1 * 10)])
def test_glue_run_plans_its_batches_per_epoch_times_the_tasks_epochs(config, tmp_path, max_examples, updates):
    config["glue"]["max_examples"] = max_examples  # RTE's test file: 50 examples; batch 32, 10 epochs
    glue = next(job for job in build_jobs(config, tmp_path) if job.kind == "glue" and "/RTE/" in job.name)
    assert glue.training[0].updates is None  # its log says, once it runs
    assert glue.work == updates * 32 * 128


def test_evaluate_at_keeps_those_checkpoints_and_evaluates_each(config, tmp_path):
    config["pretrain"].update(updates=40, validate_every=10, evaluate_at=[20, 10])
    config = check_config(config, ARCHS)
    jobs = {job.name: job for job in build_jobs(config, tmp_path)}
    pretrain = jobs["pretrain/tupe_r_tiny/seed1"]
    train, snapshots = pretrain.commands
    assert train[train.index("--keep-interval-updates-pattern") + 1] == "10"
    assert snapshots[-3:] == ["--at", "10", "20"]
    glue = jobs["glue/tupe_r_tiny/seed1/at20/RTE/lr2e-05/seed2"]
    assert str(tmp_path / "pretrain" / "tupe_r_tiny" / "seed1" / "checkpoints" / "checkpoint_at20.pt") in \
        glue.commands[0] and glue.deps == ["pretrain/tupe_r_tiny/seed1"]
    assert "analysis/tupe_r_tiny/seed1/at10" in jobs and "analysis/tupe_r_tiny/seed1" in jobs


def test_evaluate_at_an_update_without_a_checkpoint_names_the_interval(config):
    config["pretrain"].update(updates=40, validate_every=10, evaluate_at=[15])
    with pytest.raises(StudyConfigError, match=r"pretrain.evaluate_at\[0\]': 15 is not a multiple of the "
                                               r"checkpoint interval 10 \(pretrain.validate_every\)"):
        check_config(config, ARCHS)


def test_snapshot_links_fairseqs_checkpoint_of_that_update(tmp_path):
    from tupe_plugin.study import snapshots

    (tmp_path / "checkpoint_3_20.pt").write_bytes(b"weights at 20")
    assert snapshots.main(["--save-dir", str(tmp_path), "--at", "20"]) == 0
    assert (tmp_path / "checkpoint_at20.pt").read_bytes() == b"weights at 20"
    with pytest.raises(SystemExit, match="has no checkpoint of update 30"):
        snapshots.main(["--save-dir", str(tmp_path), "--at", "30"])


def test_stages_train_one_after_the_other_from_the_previous_stages_checkpoint(config, tmp_path):
    config = check_config({"archs": ["tupe_r_tiny"], "analysis": False, "pretrain": {"stages": [
        {"tokens_per_sample": 64, "updates": 30}, {"tokens_per_sample": 128, "updates": 10}]}}, ARCHS)
    assert (config["pretrain"]["updates"], config["pretrain"]["tokens_per_sample"]) == (40, 128)
    jobs = {job.name: job for job in build_jobs(config, tmp_path)}
    first, second = jobs["pretrain/tupe_r_tiny/seed1"].commands
    flag = lambda command, name: command[command.index(name) + 1]  # noqa: E731
    assert [flag(first, "--tokens-per-sample"), flag(second, "--tokens-per-sample")] == ["64", "128"]
    assert flag(first, "--max-positions") == flag(second, "--max-positions") == "128"
    assert [flag(first, "--max-update"), flag(second, "--max-update")] == ["30", "10"]
    folder = tmp_path / "pretrain" / "tupe_r_tiny" / "seed1"
    assert flag(second, "--finetune-from-model") == str(folder / "stage1" / "checkpoint_last.pt")
    assert flag(second, "--save-dir") == str(folder / "checkpoints")
    assert "--finetune-from-model" not in first
    data = jobs["data"].commands[1]
    assert data[data.index("--max-pieces") + 1] == "62"  # lines that fit the first stage's 64 tokens
    assert config["pretrain"]["evaluate_at"] == [30]  # the first stage's end is evaluated too
    stage_end = Model("tupe_r_tiny", 1, 30, stage=1)
    assert stage_end.checkpoint(tmp_path) == str(folder / "stage1" / "checkpoint_last.pt")


def test_stages_give_the_updates_and_the_lengths(config):
    with pytest.raises(StudyConfigError, match=r"key 'pretrain.updates': is given by pretrain.stages"):
        check_config({"archs": ["tupe_r_tiny"], "pretrain": {"updates": 5, "stages": [
            {"tokens_per_sample": 64, "updates": 30}, {"tokens_per_sample": 128, "updates": 10}]}}, ARCHS)


def test_a_rope_scaling_is_an_extrapolation_job_of_its_own_beside_the_unscaled_one(config, tmp_path):
    config["extrapolation"] = {"lengths": [256], "batch_size": 8,
                               "rotary_scalings": [{"scaling": "linear", "factor": 4}]}
    jobs = {job.name: job for job in build_jobs(config, tmp_path)}
    scaled = jobs["extrapolation/tupe_r_tiny/seed1/len256-linear4"]
    assert scaled.commands[0][-5:] == ["--rotary-scaling", "linear", "--rotary-scaling-factor", "4", "--cpu"]
    assert "--rotary-scaling" not in jobs["extrapolation/tupe_r_tiny/seed1/len256"].commands[0]


def test_init_from_starts_every_architecture_from_the_same_checkpoint(tmp_path):
    start = tmp_path / "start.pt"
    start.write_bytes(b"a checkpoint")
    config = check_config({"archs": ["bert_a_tiny", "tupe_r_tiny"], "analysis": False,
                           "pretrain": {"init_from": str(start)}}, ARCHS)
    jobs = build_jobs(config, tmp_path / "out")
    for arch in ("bert_a_tiny", "tupe_r_tiny"):
        command = next(job for job in jobs if job.name == f"pretrain/{arch}/seed1").commands[0]
        assert command[command.index("--init-from-checkpoint") + 1] == str(start)
    before = fingerprints(config, tmp_path / "out")
    start.write_bytes(b"another checkpoint")
    assert {n for n in changed(before, fingerprints(config, tmp_path / "out"))} == {
        "pretrain/bert_a_tiny/seed1", "pretrain/tupe_r_tiny/seed1"}
