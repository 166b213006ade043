"""RoBERTa's flags on the plugin's model: each one takes effect or stops the build naming it."""

import math

import pytest
import torch
from cli import run_fairseq_steps, train_args, train_inner_losses
from conftest import build_model, random_tokens
from fairseq.modules import LayerDropModuleList
from tupe_plugin.models.model_flags import UNSUPPORTED_ROBERTA_FLAGS
from tupe_plugin.encodings.position_config import PositionFlagError

REFUSED = [
    ("quant_noise_pq", 0.1), ("quant_noise_scalar", 0.2), ("quant_noise_pq_block_size", 16),
    ("mha_heads_to_keep", 2), ("ffn_blocks_to_remove", 1), ("mha_reg_scale_factor", 0.1),
    ("ffn_reg_scale_factor", 0.1), ("min_params_to_wrap", 1000),
]


def test_every_unimplemented_roberta_flag_is_in_the_refusal_list():
    assert {flag for flag, _ in REFUSED} == {flag for flag, _, _ in UNSUPPORTED_ROBERTA_FLAGS}


@pytest.mark.parametrize("flag, value", REFUSED)
def test_unimplemented_roberta_flag_stops_the_build_naming_it(flag, value, dictionary):
    with pytest.raises(PositionFlagError, match=f"--{flag.replace('_', '-')} {value} is not supported"):
        build_model("tupe_r_tiny", dictionary, **{flag: value})


@pytest.mark.parametrize("flag, off", [(flag, off) for flag, off, _ in UNSUPPORTED_ROBERTA_FLAGS])
def test_unimplemented_roberta_flag_at_its_default_is_accepted(flag, off, dictionary):
    build_model("bert_a_tiny", dictionary, **{flag: off})


def test_layernorm_embedding_flags_agree(dictionary):
    def has_layernorm(**flags):
        encoder = build_model("bert_a_tiny", dictionary, **flags).encoder.sentence_encoder
        return encoder.layernorm_embedding is not None

    assert has_layernorm()
    assert has_layernorm(layernorm_embedding=True)
    assert not has_layernorm(no_layernorm_embedding=True)
    with pytest.raises(PositionFlagError, match="--layernorm-embedding and --no-layernorm-embedding"):
        has_layernorm(layernorm_embedding=True, no_layernorm_embedding=True)


def test_layer_norm_eps_reaches_every_layer_norm_of_encoder_lm_head_and_untied_term(dictionary):
    def epsilons(**flags):
        model = build_model("tupe_r_tiny", dictionary, **flags)
        return [module.eps for module in model.modules() if isinstance(module, torch.nn.LayerNorm)]

    assert set(epsilons()) == {1e-5}
    given = epsilons(layer_norm_eps=1e-12)
    assert set(given) == {1e-12} and len(given) == len(epsilons())


@pytest.mark.parametrize("value", [0.0, -1e-5, 1.0])
def test_layer_norm_eps_outside_zero_one_is_refused(value, dictionary):
    with pytest.raises(PositionFlagError, match="--layer-norm-eps is a small positive number"):
        build_model("bert_a_tiny", dictionary, layer_norm_eps=value)


@pytest.mark.parametrize("value", [-0.1, 1.0])
def test_encoder_layerdrop_outside_zero_one_is_refused(value, dictionary):
    with pytest.raises(PositionFlagError, match="--encoder-layerdrop is a probability"):
        build_model("tupe_r_tiny", dictionary, encoder_layerdrop=value)


def _layers_run(model, dictionary, forwards):
    calls = []
    layers = model.encoder.sentence_encoder.layers
    for index in range(len(layers)):  # iterating a LayerDropModuleList in training drops layers
        layers[index].register_forward_hook(lambda *_: calls.append(1))
    tokens = random_tokens(dictionary, [6, 4])
    for _ in range(forwards):
        model(tokens, features_only=True)
    return len(calls)


def test_layerdrop_skips_whole_layers_in_training(dictionary):
    model = build_model("tupe_r_tiny", dictionary, encoder_layers=4, encoder_layerdrop=0.5).train()
    assert isinstance(model.encoder.sentence_encoder.layers, LayerDropModuleList)
    torch.manual_seed(0)
    run = _layers_run(model, dictionary, forwards=20)
    assert 0.3 * 80 < run < 0.7 * 80


def test_layerdrop_runs_every_layer_in_evaluation(dictionary):
    model = build_model("tupe_r_tiny", dictionary, encoder_layers=4, encoder_layerdrop=0.5).eval()
    assert _layers_run(model, dictionary, forwards=5) == 4 * 5


def test_layerdrop_evaluation_is_deterministic(dictionary):
    model = build_model("bert_r_tiny", dictionary, encoder_layers=4, encoder_layerdrop=0.5).eval()
    tokens = random_tokens(dictionary, [6, 4])
    with torch.no_grad():
        first, second = (model(tokens, features_only=True)[0] for _ in range(2))
    assert torch.equal(first, second)


def test_fairseq_train_refuses_quant_noise_and_trains_with_layerdrop(wikitext_bin, tmp_path):
    outputs, code = run_fairseq_steps(
        ("train", train_args(wikitext_bin, tmp_path / "quant", "tupe_r_tiny", 1, "--quant-noise-pq", 0.1)),
        check=False,
    )
    assert code != 0 and "--quant-noise-pq 0.1 is not supported" in outputs[-1]
    (output,) = run_fairseq_steps(
        ("train", train_args(wikitext_bin, tmp_path / "layerdrop", "tupe_r_tiny", 3,
                             "--encoder-layerdrop", 0.5, "--encoder-layers", 4)),
    )
    losses = train_inner_losses(output)
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)


def test_a_refused_flag_is_one_error_line_without_traceback(wikitext_bin, tmp_path):
    outputs, code = run_fairseq_steps(
        ("train", train_args(wikitext_bin, tmp_path, "bert_a_tiny", 1, "--mha-heads-to-keep", 2)),
        check=False,
    )
    assert code == 1
    assert "\nerror: invalid model flags:\n  --mha-heads-to-keep 2 is not supported" in outputs[-1]
    assert "Traceback" not in outputs[-1]
