"""benchmarks/report.py and the results files: the docs' tables are what the files give, cell by cell (paired
median [min–max], repetitions, verdict by benchmarks/paired.py's rule), the newest run of a setting wins,
a target without a file says so with its command, and the repository's docs are in step with its files."""

import json
import os
import re
import shlex

import pytest
from conftest import REPO, load_benchmark

report = load_benchmark("report")
benchmark, benchmark_attention = report.benchmark, report.benchmark_attention
results_file = report.results_file

BENCHMARKS_PAGE = os.path.join(REPO, "docs", "benchmarks.md")
MACHINE = {"cpu": "Test CPU", "cores": 2, "torch": "2.13.0+cpu", "threads": 2, "python": "3.11", "gpu": None}


def step_run(date, costs, attention_dropout=0.1, seq_len=512, batch=2, peak=None, share=0.001):
    """A results file of benchmark.py as a CPU run at medium size writes it, with the costs per round
    ({contender: [seconds]}) chosen here."""
    rounds = len(next(iter(costs.values())))
    results = {name: {"round_seconds": values, "peak_bytes": (peak or {}).get(name, 100),
                      "positional_term_share": None if name == "roberta" else share}
               for name, values in costs.items()}
    return {"format": 1, "benchmark": "benchmark", "date": date, "machine": MACHINE,
            "command": f"python benchmarks/benchmark.py --rounds {rounds}",
            "commit": "0123456789abcdef", "dirty": False,
            "settings": {"device": "cpu", "bf16": False, "fp16": False, "size": "medium", "rounds": rounds,
                         "attention_dropout": attention_dropout},
            "rounds": [], "shapes": [{"seq_len": seq_len, "batch": batch, "results": results}]}


def train_run(date, words_per_second, attention_dropout=0.1, seq_len=512, batch=4):
    """A results file of benchmark_train.py, the words/s of each repetition chosen here."""
    return {"format": 1, "benchmark": "benchmark_train", "date": date, "machine": MACHINE,
            "command": "python benchmarks/benchmark_train.py demo/data-bin",
            "commit": "fedcba9876543210", "dirty": True,
            "settings": {"size": "medium", "attention_dropout": attention_dropout,
                         "tokens_per_sample": seq_len, "batch_size": batch},
            "rounds": [], "words_per_second": words_per_second}


def write_runs(folder, *runs):
    os.makedirs(folder, exist_ok=True)
    for number, run in enumerate(runs):
        results_file.write(run, os.path.join(folder, f"{run['benchmark']}-{run['date'][:10]}-{number}.json"))
    return str(folder)


def generated(folder):
    return report.blocks(results_file.load(folder))


def table_row(text, label):
    """The cells of the first table row of ``text`` that starts with ``label``."""
    line = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.strip("|").split(" | ")]


TUPE_R_NO_DROPOUT = "`tupe_r` / `bert_a`: step time ratio (attention dropout 0)"
TUPE_R_LONG = "`tupe_r` / `bert_a`: step time ratio (T >= 512)"
# Columns of the CPU step table after the target and its bound: attention dropout 0.1 at T = 128 and 512,
# attention dropout 0 at T = 128 and 512.
AD01_T512, AD0_T128, AD0_T512 = 3, 4, 5
# Paired ratios in the order the rounds ran: median 1.02, min 1.00, max 1.05.
RATIOS = [1.04, 1.00, 1.05, 1.02, 1.01]


def test_cell_is_the_paired_median_with_its_range_repetitions_and_verdict(tmp_path):
    bert_a = [2.0, 2.2, 1.8, 2.0, 2.4]  # a drifting machine: the pairing keeps it out of the ratio
    run = step_run("2026-11-27T10:00:00+00:00", attention_dropout=0.0, costs={
        "bert_a": bert_a, "tupe_r": [c * r for c, r in zip(bert_a, RATIOS)],
        "tupe_a": [c * 1.06 for c in bert_a], "plain_tupe_r": [c * 1.10 for c in bert_a]},
        peak={"bert_a": 1000, "tupe_r": 1049, "tupe_a": 1000, "plain_tupe_r": 1000})
    targets = generated(write_runs(tmp_path / "results", run))["targets"]
    row = table_row(targets, TUPE_R_NO_DROPOUT)
    assert row[1] == "1.03 ×"  # median 1.02 within, max 1.05 over: inside the noise
    assert row[AD0_T512] == "1.020 [1.000–1.050] × (n = 5): inside the noise, run 1"
    assert row[2:AD0_T128] == ["–", "–"] and row[AD0_T128] == "not measured"
    assert table_row(targets, "`tupe_a` / `bert_a`: step time ratio (T >= 512)")[AD0_T512] == \
        "1.060 [1.060–1.060] × (n = 5): **missed**, run 1"
    plain = "`tupe_r` / `plain_tupe_r`: step time ratio (attention dropout 0)"
    assert table_row(targets, plain)[AD0_T512] == "0.927 [0.909–0.955] × (n = 5): met, run 1"
    assert table_row(targets, "`tupe_r` / `bert_a`: peak memory ratio (every run)")[AD0_T512] == \
        "1.049 × (one step): met, run 1"
    assert table_row(targets, "`tupe_r` positional term share of its step")[AD0_T512] == "0.10 %: met, run 1"
    assert ("- run 1: `python benchmarks/benchmark.py --rounds 5`; "
            "`benchmarks/results/benchmark-2026-11-27-0.json`, commit 0123456, 2026-11-27, "
            "Test CPU (2 cores, 2 torch threads), torch 2.13.0+cpu") in targets


def test_fewer_rounds_than_a_verdict_needs_say_so(tmp_path):
    run = step_run("2026-11-27T10:00:00+00:00", {"bert_a": [1.0] * 4, "tupe_r": [1.0] * 4})
    targets = generated(write_runs(tmp_path / "results", run))["targets"]
    assert table_row(targets, TUPE_R_LONG)[AD01_T512] == \
        "1.000 [1.000–1.000] × (n = 4): too few repetitions, run 1"


def test_the_newest_run_of_a_setting_wins(tmp_path):
    older = step_run("2026-11-20T09:00:00+00:00", {"bert_a": [1.0] * 5, "tupe_r": [1.2] * 5})
    newer = step_run("2026-11-27T09:00:00+00:00", {"bert_a": [1.0] * 5, "tupe_r": [1.01] * 5})
    other_length = step_run("2026-11-28T09:00:00+00:00", {"bert_a": [1.0] * 5, "tupe_r": [1.5] * 5},
                            seq_len=128, batch=8)
    targets = generated(write_runs(tmp_path / "results", newer, older, other_length))["targets"]
    assert table_row(targets, TUPE_R_LONG)[AD01_T512] == "1.010 [1.010–1.010] × (n = 5): met, run 2"
    assert table_row(targets, "`tupe_r` / `bert_a`: step time ratio (T < 512)")[2] == \
        "1.500 [1.500–1.500] × (n = 5): **missed**, run 1"
    assert "2026-11-20" not in targets


def test_a_newer_run_with_too_few_rounds_does_not_hide_a_verdict(tmp_path):
    kept = step_run("2026-11-20T09:00:00+00:00", {"bert_a": [1.0] * 5, "tupe_r": [1.01] * 5})
    short = step_run("2026-11-27T09:00:00+00:00", {"bert_a": [1.0] * 3, "tupe_r": [1.3] * 3})
    targets = generated(write_runs(tmp_path / "results", kept, short))["targets"]
    assert table_row(targets, TUPE_R_LONG)[AD01_T512].startswith("1.010 ")


def test_a_target_without_a_results_file_is_listed_as_not_measured_with_its_command(tmp_path):
    blocks = generated(str(tmp_path / "empty"))
    assert table_row(blocks["targets"], TUPE_R_NO_DROPOUT)[2:] == ["–", "–", "not measured", "not measured"]
    assert ("- attention dropout 0, T = 128 (B = 8); attention dropout 0, T = 512 (B = 2): not measured "
            "since results are kept as files; to measure: `make bench BENCH_ARGS=\"--rounds 9 "
            "--attention-dropout 0 --results-dir benchmarks/results\"`") in blocks["targets"]
    assert "- every column: not measured since results are kept as files; to measure: " \
        "`bash benchmarks/gpu_checks.sh`" in blocks["targets"]
    assert "run 1" not in blocks["targets"] + blocks["attention"]
    assert "≤ 1.02 ×: not measured" in blocks["headline"]


def test_headline_quotes_tupe_r_against_bert_a_in_real_updates(tmp_path):
    bert_a = [1000.0] * 5
    run = train_run("2026-11-27T09:00:00+00:00", {"bert_a": bert_a, "roberta": [w * 0.8 for w in bert_a],
                                                  "tupe_r": [w / r for w, r in zip(bert_a, RATIOS)]})
    blocks = generated(write_runs(tmp_path / "results", run))
    label = "time per word, real `fairseq-train` updates on CPU, attention dropout 0.1"
    row = table_row(blocks["headline"], label)
    assert row[1:] == ["≤ 1.02 ×: not measured", "≤ 1.02 ×: 1.020 [1.000–1.050] × (n = 5): inside the noise"]
    targets = blocks["targets"]
    assert table_row(targets, "`bert_a` / `roberta`: time per word ratio")[3] == \
        "0.800 [0.800–0.800] × (n = 5): met, run 1"
    assert "commit fedcba9 with uncommitted changes" in targets


def test_attention_table_pairs_each_path_with_the_floor_call_by_call(tmp_path):
    floor = [0.010, 0.020, 0.010]
    times = {"sdpa": floor, "biased-flash": [0.011, 0.021, 0.012], "explicit": floor, "chunked": floor}
    run = {"format": 1, "benchmark": "benchmark_attention", "date": "2026-11-27T09:00:00+00:00",
           "command": "python benchmarks/benchmark_attention.py", "machine": MACHINE,
           "commit": None, "dirty": None, "rounds": [],
           "settings": {"device": "cpu", "dtype": "float32", "attention_dropout": 0.0, "tokens": 1024,
                        "heads": 8, "head_dim": 64},
           "shapes": [{"seq_len": 128, "batch": 8, "cpu_seconds": times, "wall_seconds": times}]}
    attention = generated(write_runs(tmp_path / "results", run))["attention"]
    setting = "CPU, float32, attention dropout 0, H = 8, d_h = 64, 1024 tokens; CPU time / `sdpa`"
    assert table_row(attention, f"{setting} | 128")[2:] == [
        "`biased-flash` 1.100 [1.050–1.200] ×, `explicit` 1.000 [1.000–1.000] ×, "
        "`chunked` 1.000 [1.000–1.000] × (n = 3)", "1"]
    assert table_row(attention, f"{setting} | 64")[2:] == ["not measured", "–"]
    assert "commit unknown" in attention


def test_check_fails_on_a_stale_block_and_passes_after_write(tmp_path, capsys):
    doc = tmp_path / "doc.md"
    doc.write_text("# Speed\n\nhand-written\n\n<!-- generated by benchmarks/report.py: headline -->\n"
                   "| TUPE-R / BERT-A | typed by hand |\n<!-- end generated -->\n\nhand-written too\n")
    folder = write_runs(tmp_path / "results", step_run("2026-11-27T09:00:00+00:00", {"bert_a": [1.0] * 5}))
    args = ["--results-dir", folder, "--docs", str(doc)]
    assert report.main(args + ["--check"]) == 1
    assert "generated tables out of date" in capsys.readouterr().err
    assert report.main(args + ["--write"]) == 0
    text = doc.read_text()
    assert text.startswith("# Speed\n\nhand-written\n\n<!-- generated by benchmarks/report.py: headline -->\n"
                           "| TUPE-R / BERT-A | T = 128 | T = 512 |\n")
    assert text.endswith("<!-- end generated -->\n\nhand-written too\n") and "typed by hand" not in text
    assert report.main(args + ["--check"]) == 0


def test_a_doc_without_generated_blocks_or_with_an_unknown_one_is_refused(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("no markers\n")
    with pytest.raises(SystemExit, match="holds no block generated"):
        report.main(["--results-dir", str(tmp_path), "--docs", str(doc), "--check"])
    doc.write_text("<!-- generated by benchmarks/report.py: typo -->\n<!-- end generated -->\n")
    with pytest.raises(SystemExit, match="no generated block is called 'typo'"):
        report.main(["--results-dir", str(tmp_path), "--docs", str(doc), "--check"])


def test_a_json_file_that_is_no_results_file_is_refused_by_name(tmp_path):
    (tmp_path / "benchmark.json").write_text(json.dumps({"settings": {}}))
    with pytest.raises(SystemExit, match=r"benchmark.json is no results file: it lacks format, benchmark"):
        report.main(["--results-dir", str(tmp_path)])


def test_a_tiny_run_keeps_its_command_machine_commit_and_every_round(tmp_path):
    argv = ["--size", "tiny", "--seq-lens", "16", "--batch-sizes", "2", "--rounds", "2", "--steps", "1",
            "--warmup", "0", "--vocab", "50", "--no-memory", "--contenders", "bert_a", "tupe_r",
            "--json", str(tmp_path / "bench.json"), "--results-dir", str(tmp_path / "results")]
    printed = benchmark.main(argv)
    (name,) = os.listdir(tmp_path / "results")
    assert re.fullmatch(r"benchmark-\d{4}-\d\d-\d\d-cpu-fp32-tiny-ad0\.1-T16B2\.json", name)
    (run,) = results_file.load(str(tmp_path / "results"))
    assert run["command"] == shlex.join(["python", "benchmarks/benchmark.py", *argv])
    assert set(results_file.REQUIRED) <= set(run) and run["format"] == results_file.FORMAT
    assert {"cpu", "cores", "torch", "threads", "python", "gpu"} <= set(run["machine"])
    assert re.fullmatch(r"[0-9a-f]{40}", run["commit"]) and isinstance(run["dirty"], bool)
    (rounds,) = run["rounds"]
    assert rounds["baseline"] == "bert_a" and rounds["setting"] == "T=16 B=2"
    assert rounds["costs"]["tupe_r"] == printed["shapes"][0]["results"]["tupe_r"]["round_seconds"]
    assert len(rounds["costs"]["tupe_r"]) == 2 and len(rounds["paired"]["tupe_r"]["ratios"]) == 2
    assert json.loads((tmp_path / "bench.json").read_text())["rounds"] == run["rounds"]


def test_a_second_run_of_the_day_is_kept_beside_the_first(tmp_path):
    run = step_run("2026-11-27T09:00:00+00:00", {"bert_a": [1.0]})
    first = results_file.save(run, str(tmp_path), "cpu-fp32-medium")
    second = results_file.save(run, str(tmp_path), "cpu-fp32-medium")
    assert [os.path.basename(first), os.path.basename(second)] == [
        "benchmark-2026-11-27-cpu-fp32-medium.json", "benchmark-2026-11-27-cpu-fp32-medium-2.json"]


def test_a_gpu_run_is_named_by_its_gpu(tmp_path):
    run = {**step_run("2026-11-27T09:00:00+00:00", {"bert_a": [1.0]}),
           "machine": {**MACHINE, "gpu": "NVIDIA H100 80GB HBM3"}}
    path = results_file.save(run, str(tmp_path), "cuda-bf16-base")
    assert os.path.basename(path) == "benchmark-2026-11-27-nvidia-h100-80gb-hbm3-cuda-bf16-base.json"


def test_gpu_step_runs_are_judged_by_the_gpu_targets(tmp_path):
    run = step_run("2026-11-27T09:00:00+00:00", {"bert_a": [1.0] * 5, "tupe_r": [1.07] * 5}, batch=64)
    run["settings"].update(device="cuda", bf16=True, size="base")
    gpu_table = generated(write_runs(tmp_path / "results", run))["targets"].split("GPU training steps")[1]
    assert table_row(gpu_table, "`tupe_r` / `bert_a`: step time ratio (T >= 512)")[1:4] == [
        "1.08 ×", "–", "1.070 [1.070–1.070] × (n = 5): met, run 1"]


def test_gpu_train_runs_are_judged_by_words_per_second_against_bert_a(tmp_path):
    run = train_run("2026-11-27T09:00:00+00:00", {"bert_a": [1000.0] * 5, "tupe_r": [960.0] * 5}, batch=64)
    run["settings"].update(device="cuda", bf16=True, size="base")
    blocks = generated(write_runs(tmp_path / "results", run))
    gpu_table = blocks["targets"].split("Real `fairseq-train` updates on a GPU")[1]
    assert table_row(gpu_table, "`tupe_r` / `bert_a`: time per word ratio")[1:] == [
        "1.05 ×", "1.042 [1.042–1.042] × (n = 5): met, run 1"]


def test_attention_runs_keep_each_calls_time_per_path(tmp_path):
    benchmark_attention.main(["--seq-lens", "16", "--tokens", "32", "--heads", "2", "--head-dim", "8",
                              "--rounds", "1", "--calls", "2", "--json", str(tmp_path / "a.json"),
                              "--results-dir", str(tmp_path / "kept")])
    (run,) = results_file.load(str(tmp_path / "kept"))
    (rounds,) = run["rounds"]
    assert rounds["baseline"] == "sdpa" and set(rounds["costs"]) == set(benchmark_attention.PATHS)
    assert all(len(values) == 2 for values in rounds["costs"].values())


def test_benchmarks_page_fits_in_300_lines():
    with open(BENCHMARKS_PAGE, encoding="utf-8") as f:
        assert len(f.read().splitlines()) <= 300


def test_the_docs_hold_the_tables_the_committed_results_files_give():
    """Fails after a results file is added or a target changes until `make bench-report` is run."""
    assert report.main(["--check"]) == 0


def test_every_command_of_record_is_a_checked_command_of_the_benchmarks_page():
    """The commands the tables name are in the page's bash blocks, whose flags tests/test_docs_commands.py
    checks against each script's --help."""
    with open(BENCHMARKS_PAGE, encoding="utf-8") as f:
        blocks = "\n".join(re.findall(r"```bash\n(.*?)```", f.read(), re.S))
    commands = {column.command for table in report.TABLES for column in table.columns}
    commands |= {setting.command for setting in report.ATTENTION}
    for command in commands:
        assert command in blocks, command


def test_a_copy_without_git_records_the_commit_benchmark_commit_names(monkeypatch):
    def no_git(*args, **kwargs):
        raise OSError("not a git repository")

    monkeypatch.setattr(results_file.subprocess, "run", no_git)
    monkeypatch.setenv(results_file.COMMIT_VARIABLE, "c0abd1a")
    assert results_file.git_state() == {"commit": "c0abd1a", "dirty": None}
    monkeypatch.delenv(results_file.COMMIT_VARIABLE)
    assert results_file.git_state() == {"commit": None, "dirty": None}
