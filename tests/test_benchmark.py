"""scripts/benchmark.py: its contenders compute the plugin's function, its report has the promised
structure (tiny size, one repetition; the times themselves are not checked)."""

import copy
import json
import os
import sys

import pytest
import torch
from conftest import REPO, assert_gradients_close, build_model, features_and_grads, random_tokens

sys.path.insert(0, os.path.join(REPO, "scripts"))
import benchmark  # noqa: E402

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
    plain = variant is benchmark.make_plain_reference
    assert_gradients_close(twin_grads, grads, rename=lambda name: name.replace(
        "positional_term.", "positional_term.shared.") if plain else name)


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
    targets = {row["target"] for row in report["targets"]}
    assert {"bert_a step time / roberta", "tupe_r step time / bert_a",
            "tupe_r step time / plain_tupe_r", "tupe_r peak memory / bert_a",
            "tupe_r positional term / step"} == targets
    printed = capsys.readouterr().out
    assert printed.strip() == report["markdown"].strip()
    for name in CONTENDERS:
        assert f"| {name} |" in printed


def test_unknown_contender_names_the_flag():
    with pytest.raises(SystemExit, match="--contenders"):
        benchmark.main(["--contenders", "bert_a", "tupe_x", "--json", os.devnull])


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


def test_positional_term_timing_builds_the_mask_in_the_dtype_the_model_uses(tmp_path, monkeypatch):
    """Under autocast the encoder builds its mask in its activations' dtype (float32); the timing
    of the positional term must build the same mask, not one in the autocast dtype."""
    from tupe_plugin.modules.positional_term import PositionalTerm

    contender, sample = _contender(tmp_path, "tupe_r", "--bf16")
    dtypes = []
    original = PositionalTerm.attention_mask
    monkeypatch.setattr(PositionalTerm, "attention_mask",
                        lambda term, padding, dtype: dtypes.append(dtype) or original(term, padding, dtype))
    contender.step(sample)
    contender.positional_term_seconds(sample, repeats=1)
    assert dtypes == [torch.float32] * 3
