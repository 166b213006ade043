"""benchmarks/benchmark.py: its contenders compute the plugin's function, its report has the promised
structure (tiny size, one repetition; the times themselves are not checked)."""

import argparse
import copy
import json
import os
import statistics

import pytest
import torch
from conftest import assert_gradients_close, build_model, features_and_grads, load_benchmark, random_tokens
from tupe_plugin.encodings import untied_product

benchmark = load_benchmark("benchmark")
benchmark_attention = load_benchmark("benchmark_attention")
benchmark_train = load_benchmark("benchmark_train")

CONTENDERS = ["roberta", "bert_a", "tupe_r", "plain_tupe_r", "sdpa_tupe_r"]


@pytest.mark.parametrize("preset", ["tupe_r", "bert_r", "tupe_a", "bert_a"])
@pytest.mark.parametrize("variant", [benchmark.make_plain_reference, benchmark.make_always_sdpa])
def test_reference_contenders_compute_the_plugin_function(preset, variant, dictionary):
    model = build_model(f"{preset}_tiny", dictionary)
    twin = variant(copy.deepcopy(model))
    tokens = random_tokens(dictionary, [9, 6, 4])
    keep = tokens.ne(dictionary.pad()).unsqueeze(-1)
    weights = torch.randn(*tokens.shape, model.args.encoder_embed_dim) * keep
    features, grads = features_and_grads(model, tokens, weights)
    twin_features, twin_grads = features_and_grads(twin, tokens, weights)
    torch.testing.assert_close(twin_features * keep, features * keep, atol=1e-5, rtol=1e-5)
    # the plain term wraps the shared one
    wrapped = any(".positional_term.shared." in name for name in twin_grads)
    assert_gradients_close(twin_grads, grads, rename=lambda name: name.replace(
        "positional_term.", "positional_term.shared.") if wrapped else name)


def test_report_has_a_row_per_contender_ratios_and_target_verdicts(tmp_path, capsys):
    path = tmp_path / "bench.json"
    report = benchmark.main([
        "--size", "tiny", "--seq-lens", "16", "--batch-sizes", "2", "--rounds", "1",
        "--steps", "1", "--warmup", "0", "--vocab", "50", "--padding", "0.3",
        "--contenders", *CONTENDERS, "--json", str(path),
    ])
    assert json.loads(path.read_text()) == json.loads(json.dumps(report))
    (shape,) = report["shapes"]
    assert (shape["seq_len"], shape["batch"]) == (16, 2)
    assert list(shape["results"]) == CONTENDERS
    for name, result in shape["results"].items():
        assert len(result["step_seconds"]) == 1 and result["median_step_seconds"] > 0
        assert result["peak_bytes"] > 4 * result["parameters"], name
        assert (result["positional_term_share"] is None) == (name == "roberta")
    assert shape["results"]["bert_a"]["parameters"] == shape["results"]["roberta"]["parameters"] \
        - 2 * 128
    assert all(row["verdict"] is None for row in report["targets"])
    targets = {row["target"] for row in report["targets"]}
    assert {"bert_a step time / roberta", "tupe_r step time / bert_a",
            "tupe_r step time / plain_tupe_r", "tupe_r peak memory / bert_a",
            "tupe_r positional term / step"} == targets
    printed = capsys.readouterr().out
    assert printed.strip() == report["markdown"].strip()
    assert "Too few rounds (1 < 5)" in printed and "MISSED" not in printed and "| met |" not in printed
    assert "| 16 | tupe_r | bert_a | step time ratio (T < 512) | 1.10 × |" in printed  # each row names both
    assert "| 16 | tupe_r | tupe_r's own step | positional term share |" in printed
    for name in CONTENDERS:
        assert f"| {name} |" in printed


def test_verdicts_need_five_rounds():
    shape = {"seq_len": 512, "results": {
        "bert_a": {"round_seconds": [1.0] * 5, "peak_bytes": 10, "positional_term_share": 0.0},
        "tupe_r": {"round_seconds": [1.2] * 5, "peak_bytes": 10, "positional_term_share": 0.01},
    }}
    assert {row["verdict"] for row in benchmark.verdicts([shape], rounds=4, attention_dropout=0.1)} == {None}
    rows = {row["target"]: row for row in benchmark.verdicts([shape], rounds=5, attention_dropout=0.1)}
    assert rows["tupe_r step time / bert_a"]["verdict"] == "missed"
    assert rows["tupe_r positional term / step"]["verdict"] == "met"
    assert rows["tupe_r positional term / step"]["unit"] == "%"


# A drifting machine: the reference's time per word grows 20 % over five repetitions; the contender's
# ratio to it, paired within each repetition, is 1.06 in the three fast repetitions and under 1 in the slow
# ones. Separate medians (1.014) meet the 1.02 bound; the paired median (1.06) misses it.
DRIFTING_REFERENCE = [1.00, 1.05, 1.10, 1.15, 1.20]
DRIFTING_RATIOS = [1.06, 1.06, 1.06, 0.97, 1.00]


def _train_report(reference_costs, ratios):
    args = argparse.Namespace(baseline="bert_a", repetitions=len(ratios), device="cpu")
    runs = {"bert_a": [1000 / cost for cost in reference_costs],
            "tupe_r": [1000 / (cost * k) for cost, k in zip(reference_costs, ratios)]}
    cpu = {"bert_a": [10.0] * len(ratios), "tupe_r": [11.0] * len(ratios)}
    wall = {name: [20.0] * len(ratios) for name in runs}
    return benchmark_train.report(args, runs, cpu, wall)


def test_paired_ratios_miss_what_separate_medians_of_a_drifting_series_meet():
    markdown, (row,) = _train_report(DRIFTING_REFERENCE, DRIFTING_RATIOS)
    tupe_r = [cost * k for cost, k in zip(DRIFTING_REFERENCE, DRIFTING_RATIOS)]
    separate = statistics.median(tupe_r) / statistics.median(DRIFTING_REFERENCE)
    assert separate == pytest.approx(1.014, abs=1e-3) and separate <= row["bound"] == 1.02
    assert (row["median"], row["min"], row["max"]) == pytest.approx((1.06, 0.97, 1.06))
    assert row["verdict"] == "missed"
    assert "| tupe_r time per word / bert_a | 1.02 × | 1.060 [0.970–1.060] × | MISSED |" in markdown


def test_a_range_over_the_bound_with_the_median_within_is_inside_the_noise():
    ratios = [1.00, 1.01, 1.01, 1.04, 0.99]
    assert benchmark.paired.verdict(ratios, 1.02) == "inside the noise"
    assert benchmark.paired.verdict(ratios, 1.04) == "met"
    shape = {"seq_len": 512, "results": {
        "bert_a": {"round_seconds": DRIFTING_REFERENCE, "peak_bytes": 10, "positional_term_share": None},
        "tupe_r": {"round_seconds": [c * k for c, k in zip(DRIFTING_REFERENCE, ratios)], "peak_bytes": 10,
                   "positional_term_share": None},
    }}
    rows = {row["bound"]: row for row in benchmark.verdicts([shape], rounds=5, attention_dropout=0.0)
            if row["target"] == "tupe_r step time / bert_a"}
    assert {bound: row["verdict"] for bound, row in rows.items()} == {1.05: "met", 1.03: "inside the noise"}
    report = {"settings": {"baseline": "bert_a", "rounds": 5}, "shapes": [], "targets": [rows[1.03]]}
    assert "| 1.03 × | 1.010 [0.990–1.040] × | inside the noise |" in benchmark.markdown(report)
    _, (row,) = _train_report(DRIFTING_REFERENCE, ratios)
    assert row["verdict"] == "inside the noise"


def test_fewer_than_five_repetitions_give_no_verdict():
    assert benchmark.paired.verdict([1.5] * 4, 1.02) is None
    markdown, (row,) = _train_report(DRIFTING_REFERENCE[:4], DRIFTING_RATIOS[:4])
    assert row["verdict"] is None and row["median"] == pytest.approx(1.06)
    assert "Too few repetitions (4 < 5): no verdict." in markdown
    assert "| 1.02 × | 1.060 [0.970–1.060] × | – |" in markdown


def test_drift_is_the_references_last_repetition_over_its_first():
    assert benchmark.paired.drift(DRIFTING_REFERENCE) == pytest.approx(1.2)
    markdown, _ = _train_report(DRIFTING_REFERENCE, DRIFTING_RATIOS)
    assert "Drift: bert_a's time per word, last repetition / first: 1.200 ×." in markdown
    assert "| tupe_r | 896 [833–943] | 11.0 [11.0–11.0] | 20.0 [20.0–20.0] | 1.060 [0.970–1.060] " \
        "| 1.100 [1.100–1.100] |" in markdown  # CPU time beside wall time, paired too


def test_paired_ratios_need_as_many_repetitions_as_the_reference():
    with pytest.raises(ValueError, match="4 repetitions against the reference's 5"):
        benchmark.paired.ratios([1.0] * 4, [1.0] * 5)


@pytest.mark.parametrize("attention_dropout, bounds", [
    (0.0, {("tupe_r", "bert_a"): [1.05, 1.03], ("tupe_r", "plain_tupe_r"): [0.70, 1.00],
           ("bert_a", "roberta"): [1.02]}),
    (0.1, {("tupe_r", "bert_a"): [1.05], ("tupe_r", "plain_tupe_r"): [0.70],
           ("bert_a", "roberta"): [1.02, 0.90]}),
])
def test_step_time_bounds_depend_on_attention_dropout(attention_dropout, bounds):
    results = {name: {"round_seconds": [1.0] * 5, "peak_bytes": 10, "positional_term_share": None}
               for name in ("roberta", "bert_a", "tupe_r", "plain_tupe_r")}
    rows = benchmark.verdicts([{"seq_len": 512, "results": results}], 5, attention_dropout)
    for (name, reference), expected in bounds.items():
        got = [row["bound"] for row in rows if row["target"] == f"{name} step time / {reference}"]
        assert got == expected, (name, reference)


@pytest.mark.parametrize("flag", ["--rounds", "--steps"])
def test_zero_rounds_or_steps_name_the_flag(flag, capsys):
    with pytest.raises(SystemExit):
        benchmark.main([flag, "0", "--json", os.devnull])
    assert f"{flag} must be at least 1" in capsys.readouterr().err


def _run_with_a_failing_step(tmp_path, monkeypatch, failing):
    step = benchmark.Contender.step

    def fails(contender, sample):
        if contender.name == failing:
            raise RuntimeError("kernel failed to compile")
        return step(contender, sample)

    monkeypatch.setattr(benchmark.Contender, "step", fails)
    return benchmark.main(["--size", "tiny", "--seq-lens", "16", "--batch-sizes", "2", "--rounds", "1",
                           "--steps", "1", "--warmup", "1", "--vocab", "50", "--no-memory",
                           "--contenders", "bert_a", "tupe_r", "--json", str(tmp_path / "b.json")])


def test_a_contender_that_fails_is_left_out_with_its_error_and_the_others_are_timed(tmp_path, monkeypatch):
    report = _run_with_a_failing_step(tmp_path, monkeypatch, "tupe_r")
    (shape,) = report["shapes"]
    assert shape["failed"] == {"tupe_r": "RuntimeError: kernel failed to compile"}
    assert list(shape["results"]) == ["bert_a"]
    assert "- tupe_r left out: RuntimeError: kernel failed to compile" in report["markdown"]


def test_a_baseline_that_fails_stops_the_run(tmp_path, monkeypatch):
    with pytest.raises(RuntimeError, match="kernel failed to compile"):
        _run_with_a_failing_step(tmp_path, monkeypatch, "bert_a")


def test_unknown_contender_names_the_flag():
    with pytest.raises(SystemExit, match="--contenders"):
        benchmark.main(["--contenders", "bert_a", "tupe_x", "--json", os.devnull])


def test_keys_contender_is_a_shaw_preset_with_keys_only_and_refused_for_others(tmp_path):
    contender, _ = _contender(tmp_path, "keys_bert_rpe")
    config = contender.model.encoder.sentence_encoder.config
    assert config.shaw_table == "learned" and not config.shaw_values
    with pytest.raises(SystemExit, match="--contenders keys_bert_a: keys_ adds --shaw-keys-only"):
        benchmark.main(["--contenders", "bert_a", "keys_bert_a", "--json", os.devnull])


def test_triton_contenders_of_shaw_keys_and_deberta_run_on_the_kernel(tmp_path):
    contender, _ = _contender(tmp_path, "triton_keys_bert_rpe")
    encoder = contender.model.encoder.sentence_encoder
    assert encoder.attention_backend == "triton" and not encoder.config.shaw_values
    assert benchmark.preset_of("triton_keys_bert_rpe") == "bert_rpe"
    benchmark.check_contender("triton_deberta")


def test_a_triton_contender_of_shaw_values_trains_on_the_kernel(tmp_path):
    contender, sample = _contender(tmp_path, "triton_bert_rpe")
    assert contender.model.encoder.sentence_encoder.config.shaw_values
    assert contender.attention_path() == "triton"
    assert torch.isfinite(contender.step(sample))


def test_flex_contenders_run_on_flexattention_with_shaw_keys_and_deberta_and_shaw_values_are_refused(
        tmp_path):
    contender, _ = _contender(tmp_path, "flex_keys_bert_rpe", "--attention-dropout", "0")
    encoder = contender.model.encoder.sentence_encoder
    assert encoder.attention_backend == "flex" and not encoder.config.shaw_values
    assert benchmark.preset_of("flex_keys_bert_rpe") == "bert_rpe"
    benchmark.check_contender("flex_deberta")
    with pytest.raises(SystemExit, match="FlexAttention adds Shaw keys, not value vectors: "
                                         "flex_keys_bert_rpe"):
        benchmark.check_contender("flex_bert_rpe")


def test_a_flex_contender_with_attention_dropout_is_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--contenders", "bert_a", "flex_tupe_r", "--device", "cuda"])
    assert ("--contenders flex_tupe_r runs --attention-backend flex, which has no attention dropout: add "
            "--attention-dropout 0 (got 0.1)") in capsys.readouterr().err


def test_a_flex_contender_on_cpu_is_refused_naming_the_device_flag(capsys):
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--contenders", "bert_a", "flex_tupe_r", "--attention-dropout", "0"])
    assert ("--contenders flex_tupe_r runs --attention-backend flex, which trains on CUDA only: add "
            "--device cuda") in capsys.readouterr().err


def test_cudnn_contenders_build_the_preset_on_the_cudnn_graph_backend(tmp_path, monkeypatch):
    from tupe_plugin.attention import paths

    monkeypatch.setattr(paths, "cudnn_frontend_installed", lambda: True)
    monkeypatch.setattr(paths.torch.cuda, "is_available", lambda: True)
    contender, _ = _contender(tmp_path, "cudnn_tupe_r")
    assert contender.model.encoder.sentence_encoder.attention_backend == "cudnn-graph"
    assert benchmark.preset_of("cudnn_tupe_r") == "tupe_r"


@pytest.mark.parametrize("name", ["cudnn_bert_rpe", "cudnn_deberta", "cudnn_deberta_emd"])
def test_cudnn_contenders_of_shaw_and_deberta_presets_are_refused_naming_the_triton_variant(name):
    with pytest.raises(SystemExit, match=f"--contenders {name}: cuDNN's graph takes one bias shared by the "
                                         "batch.*the triton_ variant reads them"):
        benchmark.check_contender(name)


def test_cudnn_contenders_need_cuda_and_half_precision(capsys):
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--contenders", "bert_a", "cudnn_tupe_r"])
    assert "add --device cuda and --bf16 (or --fp16)" in capsys.readouterr().err


@pytest.mark.parametrize("installed, dtype, note", [
    (True, "bfloat16", None), (False, "bfloat16", "pip install nvidia-cudnn-frontend"),
    (True, "float32", "runs in bfloat16 or float16")])
def test_the_cudnn_graph_candidate_is_left_out_with_a_note_without_the_frontend_or_in_float32(
        monkeypatch, installed, dtype, note):
    monkeypatch.setattr(benchmark_attention, "cudnn_frontend_installed", lambda: installed)
    for dropout, names in ((0.0, benchmark_attention.CUDA_PATHS),
                           (0.1, benchmark_attention.CUDA_DROPOUT_PATHS)):
        args = argparse.Namespace(device="cuda", dtype=dtype, attention_dropout=dropout)
        timed = benchmark_attention.paths(args)
        assert (benchmark_attention.CUDNN_GRAPH_PATH in timed) == (note is None)
        assert set(names) - set(timed) <= {benchmark_attention.CUDNN_GRAPH_PATH}
        message = benchmark_attention.cudnn_graph_note(args)
        assert message is None if note is None else note in message


def test_default_contenders_include_every_distance_bias_and_deberta_against_shaw_keys():
    assert {"bert_alibi_asym", "bert_kerple", "bert_sandwich", "bert_fire", "deberta",
            "keys_bert_rpe"} <= set(benchmark.DEFAULT_CONTENDERS)
    for name in benchmark.DEFAULT_CONTENDERS:
        benchmark.check_contender(name)
    targets = {(name, reference) for _, name, reference, _, _ in benchmark.TARGETS}
    assert {("bert_sandwich", "bert_a"), ("deberta", "keys_bert_rpe")} <= targets


@pytest.mark.slow
def test_fairseq_train_mode_reports_words_per_second_of_every_run(wikitext_bin, tmp_path, capsys):
    path = tmp_path / "train.json"
    result = benchmark_train.main([
        str(wikitext_bin), "--contenders", "bert_a", "tupe_r", "--size", "tiny",
        "--tokens-per-sample", "32", "--batch-size", "2", "--updates", "3", "--skip", "1",
        "--repetitions", "1", "--json", str(path),
    ])
    assert json.loads(path.read_text())["words_per_second"] == result["words_per_second"]
    assert {name: len(runs) for name, runs in result["words_per_second"].items()} == {
        "bert_a": 1, "tupe_r": 1}
    assert all(wps > 0 for runs in result["words_per_second"].values() for wps in runs)
    assert [row["verdict"] for row in result["targets"]] == [None]
    assert len(result["cpu_seconds"]["tupe_r"]) == 1 and result["cpu_seconds"]["tupe_r"][0] > 0
    assert "Too few repetitions" in capsys.readouterr().out
    assert "--arch tupe_r_tiny" in result["commands"]["tupe_r"]


def test_random_tokens_make_a_corpus_fairseq_reads(tmp_path):
    from fairseq.data import Dictionary, data_utils

    benchmark_train.write_random_corpus(str(tmp_path), 2500)
    dictionary = Dictionary.load(str(tmp_path / "dict.txt"))
    dataset = data_utils.load_indexed_dataset(str(tmp_path / "train"), dictionary)
    assert [len(dataset[i]) for i in range(len(dataset))] == [1001, 1001, 501]
    words = torch.cat([dataset[i][:-1] for i in range(len(dataset))])
    assert dictionary.nspecial <= int(words.min()) and int(words.max()) < len(dictionary)


def test_fairseq_train_mode_on_a_gpu_trains_in_the_asked_precision_on_the_asked_backend(tmp_path,
                                                                                        monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    benchmark_train.write_random_corpus(str(tmp_path), 20000)
    args = benchmark_train.parse_args([str(tmp_path), "--device", "cuda", "--bf16",
                                       "--attention-backend", "triton"])
    argv = [str(a) for a in benchmark_train.command(args, "tupe_r")]
    assert "--bf16" in argv and "--cpu" not in argv
    assert argv[argv.index("--attention-backend") + 1] == "triton"
    assert "--attention-backend" not in benchmark_train.command(args, "roberta")
    assert benchmark_train.setting_tag(args) == "cuda-medium-bf16-ad0.1-T512B4"


def test_fairseq_train_mode_judges_a_gpu_by_words_per_second_within_five_percent():
    runs = {"bert_a": [1000.0] * 5, "tupe_r": [951.0] * 5}
    assert [row["verdict"] for row in benchmark_train.verdicts(runs, "cuda")] == ["met"]
    assert [row["verdict"] for row in benchmark_train.verdicts(runs, "cpu")] == ["missed"]


def test_fairseq_train_mode_refuses_a_folder_without_a_dictionary(tmp_path, capsys):
    with pytest.raises(SystemExit):
        benchmark_train.main([str(tmp_path)])
    assert "holds no dict.txt" in capsys.readouterr().err


def _contender(tmp_path, name, *flags):
    args = benchmark.parse_args(["--size", "tiny", "--vocab", "50", *flags])
    benchmark.write_dictionary(str(tmp_path), args.vocab)
    contender = benchmark.Contender(name, "tiny", 16, str(tmp_path), args)
    sample = benchmark.random_batch(contender.task.source_dictionary, 2, 16, 0.3,
                                    torch.Generator().manual_seed(0))
    return contender, sample


@pytest.mark.parametrize("attention_dropout, flash", [("0", True), ("0.1", False)])
def test_attention_kernels_name_the_sdpa_backend(tmp_path, attention_dropout, flash):
    """On CPU, bert_a takes SDPA's flash kernel without attention dropout and the explicit path with
    it (docs/benchmarks.md); on CUDA the same record names the GPU backend and its kernels."""
    contender, sample = _contender(tmp_path, "bert_a", "--attention-dropout", attention_dropout)
    kernels = contender.attention_kernels(sample)
    assert ("aten::_scaled_dot_product_flash_attention_for_cpu" in kernels) == flash
    assert all(count > 0 for count in kernels.values())


def test_profile_lists_the_costliest_operators_of_one_step_by_self_cpu_time_on_cpu(tmp_path):
    contender, sample = _contender(tmp_path, "tupe_r")
    table = contender.profile(sample, 5)
    rows = [line for line in table.splitlines()
            if line.strip() and not line.startswith(("-", "Self")) and "Name" not in line]
    assert "Self CPU" in table and len(rows) == 5 and "CUDA" not in table
    self_times = [float(row.split()[-5].rstrip("ums")) * (1e3 if row.split()[-5].endswith("ms") else 1)
                  for row in rows]
    assert self_times == sorted(self_times, reverse=True)


def test_positional_term_timing_builds_the_mask_in_the_dtype_the_model_uses(tmp_path, monkeypatch):
    """Under autocast the encoder builds its mask in its activations' dtype (float32); the timing
    of the positional term must build the same mask, not one in the autocast dtype."""
    from tupe_plugin.encodings.positional_term import PositionalTerm

    contender, sample = _contender(tmp_path, "tupe_r", "--bf16")
    dtypes = []
    original = PositionalTerm.attention_mask
    monkeypatch.setattr(PositionalTerm, "attention_mask",
                        lambda term, padding, dtype: dtypes.append(dtype) or original(term, padding, dtype))
    contender.step(sample)
    contender.positional_term_seconds(sample, repeats=1)
    assert dtypes == [torch.float32] * 3


def test_attention_mode_times_every_path_at_every_length(tmp_path, capsys):
    out = tmp_path / "attention.json"
    benchmark_attention.main(["--seq-lens", "8", "16", "--tokens", "32", "--heads", "2", "--head-dim", "8",
                              "--rounds", "2", "--calls", "2", "--json", str(out)])
    result = json.loads(out.read_text())
    assert [shape["seq_len"] for shape in result["shapes"]] == [8, 16]
    assert [shape["batch"] for shape in result["shapes"]] == [4, 2]
    for shape in result["shapes"]:
        for path in benchmark_attention.PATHS:
            assert len(shape["cpu_seconds"][path]) == len(shape["wall_seconds"][path]) == 4
    assert shape["kept_bytes"]["explicit"] == shape["kept_bytes"]["chunked"] == 4 * 2 * 2 * 16 * 16
    printed = capsys.readouterr().out
    assert all(f"| {path} |" in printed for path in benchmark_attention.PATHS)


def test_attention_mode_with_dropout_times_the_paths_that_take_it_against_the_unbiased_chunked_call(
        tmp_path, capsys):
    out = tmp_path / "attention.json"
    benchmark_attention.main(["--seq-lens", "16", "--tokens", "32", "--heads", "2", "--head-dim", "8",
                              "--rounds", "2", "--calls", "1", "--attention-dropout", "0.1",
                              "--json", str(out)])
    shape = json.loads(out.read_text())["shapes"][0]
    assert set(shape["cpu_seconds"]) == set(benchmark_attention.DROPOUT_PATHS)
    # the chunked path keeps the probabilities and a byte of keep-mask; the explicit one the dropped
    # probabilities too
    assert shape["kept_bytes"]["chunked"] == 5 * 2 * 2 * 16 * 16
    assert shape["kept_bytes"]["explicit"] == 9 * 2 * 2 * 16 * 16
    printed = capsys.readouterr().out
    assert "CPU / chunked-no-bias (paired)" in printed and "attention dropout 0.1" in printed


def test_attention_mode_refuses_a_length_longer_than_the_batch(capsys):
    with pytest.raises(SystemExit):
        benchmark_attention.main(["--seq-lens", "64", "--tokens", "32"])
    assert "--seq-lens [64]" in capsys.readouterr().err


def test_a_candidate_that_fails_is_left_out_with_its_error_and_the_others_are_timed(tmp_path, monkeypatch):
    run_path = benchmark_attention.forward_backward

    def explicit_fails(path, *args, **kwargs):
        if path == "explicit":
            raise RuntimeError("no kernel for this shape")
        return run_path(path, *args, **kwargs)

    monkeypatch.setattr(benchmark_attention, "forward_backward", explicit_fails)
    out = tmp_path / "attention.json"
    benchmark_attention.main(["--seq-lens", "16", "--tokens", "32", "--heads", "2", "--head-dim", "8",
                              "--rounds", "1", "--calls", "1", "--json", str(out)])
    (shape,) = json.loads(out.read_text())["shapes"]
    assert shape["failed"] == {"explicit": "RuntimeError: no kernel for this shape"}
    assert set(shape["wall_seconds"]) == set(benchmark_attention.PATHS) - {"explicit"}


def test_attention_mode_on_cuda_without_a_cuda_device_names_the_flag(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        benchmark_attention.main(["--device", "cuda"])
    assert "--device cuda: torch sees no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("term, reference, candidate", [
    ("shaw", "sdpa-shaw", "triton-shaw"), ("shaw", "explicit-shaw-values", "triton-shaw-values"),
    ("deberta", "sdpa-deberta", "triton-deberta")])
def test_the_relative_candidates_give_the_same_attention_and_gradients_on_sdpa_and_on_the_triton_kernel(
        term, reference, candidate):
    """The GPU candidates of Shaw keys (and values) and DeBERTa, run here on CPU (SDPA's math kernel or the
    explicit path, Triton's interpreter): the gathered mask (the kept probabilities) and the products read
    by offset (the kernel's sums by distance) give one function."""
    assert_relative_candidates_agree(term, reference, candidate, 20, "cpu", atol=1e-5)


def assert_relative_candidates_agree(term, reference, candidate, seq_len, device, atol):
    """``candidate``'s output and gradients (q, k, v, the term's tables) are ``reference``'s, float32."""
    q, k, v, bias, grad_out = benchmark_attention.inputs(2, 2, seq_len, 16, device=device)
    relative = benchmark_attention.relative_inputs(2, seq_len, 16, device, torch.float32)
    tables = [t for t in relative[term] if t.requires_grad]
    results = []
    for path in (reference, candidate):
        out = benchmark_attention.forward_backward(path, q, k, v, bias, grad_out, relative=relative)
        results.append([out] + [t.grad.clone() for t in (q, k, v, *tables)])
        for t in (q, k, v, *tables):
            t.grad = None
    for got, want in zip(*reversed(results)):
        torch.testing.assert_close(got, want, atol=atol, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dropout, expected", [("0", "CUDA_PATHS"), ("0.1", "CUDA_DROPOUT_PATHS")])
def test_attention_mode_on_cuda_times_the_gpu_kernels_against_sdpa_without_a_bias(
        tmp_path, capsys, dropout, expected):
    out = tmp_path / "attention.json"
    benchmark_attention.main(["--device", "cuda", "--seq-lens", "64", "--tokens", "128", "--heads", "2",
                              "--head-dim", "16", "--rounds", "2", "--calls", "1",
                              "--attention-dropout", dropout, "--json", str(out)])
    shape = json.loads(out.read_text())["shapes"][0]
    assert tuple(shape["wall_seconds"]) == getattr(benchmark_attention, expected)
    assert "wall / sdpa (paired)" in capsys.readouterr().out


def test_the_rope_candidates_rotate_alike_forward_and_backward():
    q, k, v, bias, grad_out = benchmark_attention.inputs(2, 3, 20, 8)
    rope = benchmark_attention.rope_inputs(q)
    results = []
    for path in benchmark_attention.ROPE_PATHS:
        out = benchmark_attention.forward_backward(path, q, k, v, bias, grad_out, rope=rope)
        results.append((out, rope[0].grad.clone()))
        rope[0].grad = None
    (torch_out, torch_grad), (triton_out, triton_grad) = results
    torch.testing.assert_close(triton_out, torch_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(triton_grad, torch_grad, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
def test_flex_attention_candidate_with_a_learned_bias_matches_the_paper_equation_and_its_bias_gradient():
    q, k, v, bias, grad_out = benchmark_attention.inputs(2, 3, 64, 16, device="cuda")
    out = benchmark_attention.forward_backward("flex-bias", q, k, v, bias, grad_out)
    got = [t.grad.clone() for t in (q, k, v, bias)]
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, bias)]
    probs = torch.softmax(leaves[0] @ leaves[1].transpose(-1, -2) / 4 + leaves[3], dim=-1)
    expected = probs @ leaves[2]
    expected.backward(grad_out)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    for name, mine, reference in zip("qkvb", got, leaves):
        torch.testing.assert_close(mine, reference.grad, atol=1e-4, rtol=1e-4, msg=f"d{name}")


def assert_distance_candidate_gives_the_equation(path, device):
    """``path``'s output and gradients (q, k, v, the dense bias where it takes one, the Toeplitz rows, the
    [CLS] values) against softmax(scale q k^T + bias + D) v step by step, D[h, i, j] = rows[h, j - i + T - 1]
    but cls[h, 0] on row 0 and cls[h, 1] on column 0 of the other rows, float32."""
    q, k, v, bias, grad_out = benchmark_attention.inputs(2, 2, 20, 16, device=device)
    rows, cls = benchmark_attention.relative_inputs(2, 20, 16, device, torch.float32)["distance"]
    out = benchmark_attention.forward_backward(path, q, k, v, bias, grad_out,
                                               relative={"distance": (rows, cls)})
    with_bias = path == "triton-bias-distance"
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, bias, rows, cls)]
    distance = torch.stack([torch.stack([torch.stack([
        leaves[5][h, 0] if i == 0 else leaves[5][h, 1] if j == 0 else leaves[4][h, j - i + 19]
        for j in range(20)]) for i in range(20)]) for h in range(2)])
    logits = leaves[0] @ leaves[1].transpose(-1, -2) / 4 + distance + (leaves[3] if with_bias else 0)
    expected = torch.softmax(logits, -1) @ leaves[2]
    expected.backward(grad_out)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    names = ("q", "k", "v", "bias", "rows", "cls")
    for name, mine, reference in zip(names, (q, k, v, bias, rows, cls), leaves):
        if name != "bias" or with_bias:
            torch.testing.assert_close(mine.grad, reference.grad, atol=1e-4, rtol=1e-4, msg=f"d{name}")


@pytest.mark.parametrize("path", ["sdpa-distance", "triton-distance", "triton-bias-distance"])
def test_the_distance_candidates_give_the_equation_of_the_expanded_bias_and_its_gradients(path):
    """SDPA on the expanded bias, the Triton kernel on the rows (Triton's interpreter here)."""
    assert_distance_candidate_gives_the_equation(path, "cpu")


@pytest.mark.gpu
def test_the_flex_distance_candidate_gives_the_equation_of_the_expanded_bias_and_its_gradients():
    assert_distance_candidate_gives_the_equation("flex-distance", "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("term", ["shaw", "deberta"])
def test_the_relative_candidates_give_the_same_attention_and_gradients_on_sdpa_and_on_flexattention(term):
    """The products read by offset in FlexAttention's score_mod against the mask SDPA gets."""
    assert_relative_candidates_agree(term, f"sdpa-{term}", f"flex-{term}", 64, "cuda", atol=1e-4)


def test_peak_memory_counts_the_storage_kept_for_the_next_untied_product(tmp_path, monkeypatch):
    """A step that writes its untied product in the storage kept from the last step allocates none for it:
    the peak counts that storage among what the model holds between steps, as it counted a fresh one."""
    args = benchmark.parse_args(["--size", "tiny", "--vocab", "50", "--attention-dropout", "0"])
    benchmark.write_dictionary(str(tmp_path), args.vocab)
    contender = benchmark.Contender("tupe_a", "tiny", 64, str(tmp_path), args)
    sample = benchmark.random_batch(contender.task.source_dictionary, 2, 64, 0.0,
                                    torch.Generator().manual_seed(0))
    contender.step(sample)  # the optimizer's state exists from the first step on
    fresh = contender.peak_bytes(sample)
    monkeypatch.setattr(untied_product, "KEPT_FROM_BYTES", 0)
    contender.step(sample)
    kept = contender.model.encoder.sentence_encoder.positional_term.product_memory.held_bytes()
    assert kept == 4 * 64 * 64 * 4  # (H, T, T) float32
    assert abs(contender.peak_bytes(sample) - fresh) < kept / 4
