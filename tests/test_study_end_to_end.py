"""scripts/study.py end to end: a tiny 2-arch study, its rerun, a killed study resumed, the
submitit launcher with submitit's local executor, and a 1-arch study with SQuAD."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from conftest import REPO, test_data

from tupe_plugin.squad.metric import evaluate

pytestmark = pytest.mark.slow

VALID_LOSS = re.compile(r"valid on 'valid' subset \| loss ([0-9.]+) .*\| num_updates (\d+)")
VALID_ACCURACY = re.compile(r"valid on 'valid' subset \|.* accuracy ([0-9.]+)")


def study_command(config, out):
    return [sys.executable, os.path.join(REPO, "scripts", "study.py"), str(config), "--out", str(out)]


def run_study(config, out):
    proc = subprocess.run(study_command(config, out), cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return proc.stdout


def write_config(folder, config):
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def tiny_config(corpus, archs, **overrides):
    config = {
        "corpus": str(corpus), "archs": archs, "data": {"vocab_size": 300},
        "pretrain": {"updates": 4, "tokens_per_sample": 64, "batch_size": 8, "validate_every": 2},
        "glue": {"dir": test_data("glue"),
                 "tasks": ["RTE"], "max_examples": 48, "max_epoch": 1, "seeds": [1], "batch_size": 16},
        "analysis": True,
    }
    config.update(overrides)
    return config


def reuse_data(source, out):
    """Copy a finished study's data and baseline jobs: same corpus and settings, so they are skipped."""
    for name in ("data", "unigram"):
        shutil.copytree(source / name, out / name)


def read_report(out):
    with open(out / "report.json", encoding="utf-8") as f:
        return json.load(f)


def log_valid_losses(path):
    with open(path, encoding="utf-8") as f:
        return [(int(u), float(loss)) for loss, u in VALID_LOSS.findall(f.read())]


def kill_session(sid):
    """SIGKILL every process of the session ``sid`` (the study started with start_new_session)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    os.kill(int(entry), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue


def attempts(out, name):
    with open(out / name / "job.json", encoding="utf-8") as f:
        return json.load(f)["attempts"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    with open(test_data("wikitext-2", "wiki.valid.head.tokens"), encoding="utf-8") as f:
        lines = f.readlines()[:400]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("".join(lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def local_study(tmp_path_factory, corpus):
    """A 2-arch study run once, then rerun: (out, first output, second output)."""
    folder = tmp_path_factory.mktemp("local")
    config = write_config(folder, tiny_config(corpus, ["bert_a_tiny", "tupe_r_tiny"]))
    out = folder / "out"
    first = run_study(config, out)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    second = run_study(config, out)
    return out, first, second, before


def test_report_numbers_are_those_of_the_job_logs(local_study):
    out, _, _, _ = local_study
    report = read_report(out)
    assert set(report["archs"]) == {"bert_a_tiny", "tupe_r_tiny"}
    for arch, entry in report["archs"].items():
        logged = log_valid_losses(out / "pretrain" / arch / "seed1" / "train.log")
        assert entry["valid_loss_curve"] == [[u, loss] for u, loss in logged]
        assert entry["valid_loss"] == logged[-1][1] and logged[-1][0] == 4
        run = out / "glue" / arch / "seed1" / "RTE" / "lr2e-05" / "seed1" / "run"
        with open(run / "train.log", encoding="utf-8") as f:
            best = max(float(a) for a in VALID_ACCURACY.findall(f.read()))
        assert entry["glue"]["RTE"]["metric"] == "accuracy"
        assert entry["glue"]["RTE"]["median"] == best and entry["glue"]["RTE"]["runs"][0]["score"] == best
        assert entry["seconds"] > 0 and entry["tokens_per_second"] > 0
        assert entry["analysis"]["identical_word_probing"]["applies"]
    with open(out / "unigram" / "unigram.json", encoding="utf-8") as f:
        assert report["unigram"] == json.load(f)
    assert all(job["status"] == "done" for job in report["jobs"].values())


def test_report_markdown_and_figures_are_written(local_study):
    out, first, _, _ = local_study
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "| bert_a_tiny |" in text and "## GLUE (dev)" in text and "unigram" in text
    assert (out / "figures" / "pretrain_valid_loss.png").is_file()
    assert (out / "figures" / "analysis_identical_word_probing.png").is_file()
    assert f"report: {out / 'report.md'}" in first


def test_rerun_redoes_nothing(local_study):
    out, _, second, before = local_study
    assert "8 job(s) already done, 0 to run" in second and "running" not in second
    for name in ("data", "pretrain/bert_a_tiny/seed1", "glue/tupe_r_tiny/seed1/RTE/lr2e-05/seed1"):
        assert attempts(out, name) == 1, name
    touched = [p for p, mtime in before.items() if p.stat().st_mtime_ns != mtime]
    assert {p.name for p in touched} <= {"report.json", "report.md", "config.json", "study.lock"} | {
        p.name for p in (out / "figures").iterdir()}


def test_killed_study_resumes_pretraining_from_its_checkpoint(tmp_path, corpus, local_study):
    pretrain = {"updates": 30, "tokens_per_sample": 64, "batch_size": 8, "validate_every": 2}
    config = tiny_config(corpus, ["bert_a_tiny"], glue=None, analysis=False, pretrain=pretrain)
    out = tmp_path / "out"
    reuse_data(local_study[0], out)
    path = write_config(tmp_path, config)
    log = out / "pretrain" / "bert_a_tiny" / "seed1" / "train.log"
    proc = subprocess.Popen(study_command(path, out), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 600
    while not (log.is_file() and any(u >= 6 for u, _ in log_valid_losses(log))):
        assert proc.poll() is None and time.monotonic() < deadline, "pre-training never reached update 6"
        time.sleep(0.5)
    kill_session(proc.pid)  # the study and its fairseq-train, mid-pre-training
    proc.wait()
    killed_at = max(u for u, _ in log_valid_losses(log))
    assert killed_at < 30
    output = run_study(path, out)
    assert "pretrain/bert_a_tiny/seed1: resuming" in output
    assert attempts(out, "pretrain/bert_a_tiny/seed1") == 2
    resumed = re.findall(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ (\d+) updates\)",
                         log.read_text(encoding="utf-8"))
    assert len(resumed) == 1 and 6 <= int(resumed[0]) <= killed_at
    assert read_report(out)["archs"]["bert_a_tiny"]["valid_loss_curve"][-1][0] == 30


def test_submitit_local_executor_runs_the_study(tmp_path, corpus, local_study):
    config = tiny_config(corpus, ["bert_a_tiny"], analysis=False,
                         launcher={"name": "submitit", "cluster": "local", "timeout_min": 10})
    out = tmp_path / "out"
    reuse_data(local_study[0], out)
    run_study(write_config(tmp_path, config), out)
    report = read_report(out)
    local = read_report(local_study[0])["archs"]["bert_a_tiny"]
    # the same commands with the same seeds: the numbers of the local launcher's run
    assert report["archs"]["bert_a_tiny"]["valid_loss_curve"] == local["valid_loss_curve"]
    assert report["archs"]["bert_a_tiny"]["glue"]["RTE"]["median"] == local["glue"]["RTE"]["median"]
    submitted = list((out / "submitit").glob("*/*_submitted.pkl"))
    assert len(submitted) == 2  # pre-training and GLUE went through submitit; data and baseline were reused


@pytest.fixture(scope="module")
def squad_study(tmp_path_factory, corpus):
    """A 1-arch study with SQuAD on a split of the first dev articles, a few fine-tuning updates."""
    folder = tmp_path_factory.mktemp("squad")
    squad = {"dev": test_data("squad", "dev-v1.1.head.json"), "max_articles": 2, "dev_every": 2,
             "max_epoch": 1, "batch_size": 16, "extra_args": ["--max-update", "3"]}
    config = tiny_config(corpus, ["tupe_r_tiny"], glue=None, analysis=False, squad=squad)
    out = folder / "out"
    run_study(write_config(folder, config), out)
    return out


def test_squad_scores_in_the_report_are_those_of_the_job_evaluation(squad_study):
    out = squad_study
    run = out / "squad" / "tupe_r_tiny" / "seed1" / "v1.1" / "seed1" / "run"
    with open(run / "eval.log", encoding="utf-8") as f:
        logged = json.loads(next(line for line in f if line.startswith('{"exact_match"')))
    report = read_report(out)
    assert report["jobs"]["squad/tupe_r_tiny/seed1/v1.1/seed1"]["status"] == "done"
    squad = report["archs"]["tupe_r_tiny"]["squad"]
    assert {key: squad[key] for key in logged} == logged
    # the logged scores are those of the job's predictions against the held-out articles
    with open(out / "squad-data" / "v1.1" / "dev.json", encoding="utf-8") as f:
        dev = json.load(f)["data"]
    with open(run / "predictions.json", encoding="utf-8") as f:
        predictions = json.load(f)
    scores = evaluate(dev, predictions)
    assert logged == {"exact_match": round(scores["exact_match"], 2), "f1": round(scores["f1"], 2)}
    questions = sum(len(paragraph["qas"]) for article in dev for paragraph in article["paragraphs"])
    assert (squad["predicted"], squad["questions"]) == (len(predictions), questions)


def test_squad_table_of_the_report_shows_the_split_and_the_scores(squad_study):
    out = squad_study
    scores = read_report(out)["archs"]["tupe_r_tiny"]["squad"]
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "## SQuAD v1.1" in text and "(first 2 articles): every 2nd article is dev" in text
    assert "not comparable with published SQuAD dev scores" in text
    assert "| arch | v1.1 EM | v1.1 F1 | predicted / questions |" in text
    assert (f"| tupe_r_tiny | {scores['exact_match']:.1f} | {scores['f1']:.1f} | "
            f"{scores['predicted']} / {scores['questions']} |") in text


def test_seeds_and_extrapolation_study_reports_intervals_and_each_length(tmp_path, corpus, local_study):
    """Two archs, two pre-training seeds, RTE from the checkpoint of update 2 and the last, extrapolation to
    4x the training length, end to end."""
    config = tiny_config(corpus, ["bert_a_tiny", "bert_rope_tiny"], analysis=False,
                         extrapolation={"lengths": [64, 256], "batch_size": 4})
    config["pretrain"].update(seeds=[1, 2], evaluate_at=[2])
    out = tmp_path / "out"
    reuse_data(local_study[0], out)
    run_study(write_config(tmp_path, config), out)
    report = read_report(out)
    rope = report["archs"]["bert_rope_tiny"]
    assert rope["valid_loss"]["n"] == 2 and set(rope["seeds"]) == {"1", "2"}
    assert rope["versus_reference"]["n"] == 2 and len(rope["versus_reference"]["ci95"]) == 2
    assert rope["extrapolation"]["256"]["loss"] > 0 and rope["extrapolation"]["256"]["reason"] is None
    assert report["archs"]["bert_a_tiny"]["extrapolation"]["256"]["reason"].startswith("table of ")
    assert (out / "figures" / "extrapolation.png").is_file()
    assert set(rope["along_pretraining"]) == {"2", "4"}
    assert all(rope["along_pretraining"][u]["glue"]["RTE"]["median"] is not None for u in ("2", "4"))
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "## Length extrapolation" in text and "95% interval" in text and "## Along pre-training" in text


@pytest.mark.parametrize("name", ["tupe-table2-tiny", "wang-table2-tiny", "modern-tiny"])
def test_the_tiny_twin_of_each_paper_protocol_runs_end_to_end(name, tmp_path):
    """examples/NAME.yaml as written, its GLUE and SQuAD data the repository's excerpts."""
    with open(os.path.join(REPO, "examples", f"{name}.yaml"), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    config["glue"]["dir"] = test_data("glue")
    if config.get("squad"):
        config["squad"]["dev"] = test_data("squad", "dev-v1.1.head.json")
    out = tmp_path / "out"
    run_study(write_config(tmp_path, config), out)
    report = read_report(out)
    assert all(job["status"] == "done" for job in report["jobs"].values())
    for arch in config["archs"]:
        entry = report["archs"][arch]
        assert entry["valid_loss"] is not None and entry["glue"]
        if config["pretrain"].get("evaluate_at") or config["pretrain"].get("stages"):
            assert len(entry["along_pretraining"]) == 2
        if config.get("extrapolation"):
            assert set(entry["extrapolation"]) == {str(n) for n in config["extrapolation"]["lengths"]}


def test_init_from_study_swaps_each_encoding_into_the_same_pretrained_model(tmp_path):
    """examples/wang-continue-tiny.yaml after examples/study-quick.yaml (without GLUE), end to end."""
    with open(os.path.join(REPO, "examples", "study-quick.yaml"), encoding="utf-8") as f:
        quick = yaml.safe_load(f)
    quick.update(archs=["bert_a_tiny"], glue=None, analysis=False)
    run_study(write_config(tmp_path, quick), tmp_path / "study-quick")
    with open(os.path.join(REPO, "examples", "wang-continue-tiny.yaml"), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    config["pretrain"]["init_from"] = str(tmp_path / config["pretrain"]["init_from"])
    out = tmp_path / "wang-continue"
    reuse_data(tmp_path / "study-quick", out)
    folder = tmp_path / "continue"
    folder.mkdir()
    run_study(write_config(folder, config), out)
    report = read_report(out)
    assert all(entry["valid_loss"] is not None for entry in report["archs"].values())
    log = (out / "pretrain" / "tupe_r_tiny" / "seed1" / "train.log").read_text(encoding="utf-8")
    assert "--init-from-checkpoint" in log and "copied" in log
