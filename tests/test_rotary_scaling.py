"""RoPE's angles scaled for inputs longer than in training (--rotary-scaling linear / ntk, by a factor F):
the papers' formulas, evaluation of a checkpoint trained without them, and the refusals."""

import math
import os

import pytest
import torch
from cli import logged_losses, run_fairseq_steps, train_args
from conftest import REPO, build_model, make_dictionary, random_tokens
from fairseq import checkpoint_utils, options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from omegaconf import OmegaConf
from paper_equations import rope_angles
from tupe_plugin.analysis.position_matrices import rotary_offset_matrix
from tupe_plugin.encodings.position_config import PositionConfig, PositionFlagError
from tupe_plugin.encodings.rotary_position import RotaryPosition, ntk_base
from tupe_plugin.policies.restore_architecture import prepare_training

TRAIN_LENGTH = 32


def unscaled(head_dim, base=10000.0):
    return PositionConfig(embed_dim=head_dim, num_heads=1, max_positions=8, rotary="fixed", rotary_base=base)


@pytest.mark.parametrize("learnable", [False, True])
def test_linear_scaling_rotates_position_p_by_the_unscaled_angle_of_p_over_f(learnable):
    """Position interpolation (Chen et al. 2023): the angle of position p is theta_k (p / F)."""
    rotary = RotaryPosition(16, learnable=learnable, scaling="linear", factor=4.0)
    if learnable:  # trained frequencies: the positions are divided, the learned theta_k kept
        with torch.no_grad():
            rotary.sinusoid.frequencies.mul_(torch.linspace(0.5, 1.5, 8))
    frequencies = rotary.sinusoid.frequencies.detach()
    cos, sin = rotary(4 * TRAIN_LENGTH)
    for p in range(4 * TRAIN_LENGTH):
        angles = rope_angles(unscaled(16), frequencies, p / 4.0)
        for k in range(8):
            torch.testing.assert_close(cos[p, k], torch.cos(angles[k]).detach(), atol=1e-6, rtol=0)
            torch.testing.assert_close(sin[p, k], torch.sin(angles[k]).detach(), atol=1e-6, rtol=0)


def test_ntk_base_is_base_times_f_to_the_d_over_d_minus_2():
    """NTK-aware scaling (YaRN §3): base' = base F^(d/(d-2)); the highest frequency theta_0 = 1 is kept,
    the lowest theta_(d/2-1) divided by exactly F."""
    assert ntk_base(10000.0, 4.0, 32) == pytest.approx(10000.0 * 4.0 ** (32 / 30))
    rotary = RotaryPosition(32, base=500.0, scaling="ntk", factor=4.0)
    angles = rotary.angles(torch.tensor(1)).double()
    expected_base = 500.0 * 4.0 ** (32 / 30)
    torch.testing.assert_close(angles, torch.tensor([expected_base ** (-2 * k / 32) for k in range(16)],
                                                    dtype=torch.float64), rtol=1e-6, atol=0)
    fixed = RotaryPosition(32, base=500.0).angles(torch.tensor(1)).double()
    torch.testing.assert_close(angles[0], fixed[0])
    torch.testing.assert_close(angles[-1], fixed[-1] / 4.0, rtol=1e-6, atol=0)


def test_scaling_changes_no_parameter_or_buffer(dictionary):
    plain = build_model("bert_rope_tiny", dictionary).state_dict()
    for scaling in ("linear", "ntk"):
        scaled = build_model("bert_rope_tiny", dictionary, rotary_scaling=scaling, rotary_scaling_factor=4.0)
        assert {k: v.shape for k, v in scaled.state_dict().items()} == {k: v.shape for k, v in plain.items()}
        scaled.load_state_dict(plain, strict=True)
        torch.testing.assert_close(scaled.state_dict(), plain)


def _save_trained_without_scaling(tmp_path):
    """A bert_rope_tiny checkpoint as fairseq-train writes it (cfg with task and model), trained at 32
    tokens without --rotary-scaling."""
    make_dictionary().save(str(tmp_path / "dict.txt"))
    argv = [str(tmp_path), "--user-dir", os.path.join(REPO, "tupe_plugin"), "--task", "masked_lm",
            "--arch", "bert_rope_tiny", "--tokens-per-sample", str(TRAIN_LENGTH)]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    model = tasks.setup_task(cfg.task).build_model(cfg.model)
    path = tmp_path / "checkpoint_last.pt"
    torch.save({"args": None, "model": model.state_dict(),
                "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
                "optimizer_history": [{"criterion_name": "MaskedLmLoss", "optimizer_name": "FairseqAdam",
                                       "lr_scheduler_state": {}, "num_updates": 0}],
                "extra_state": {"train_iterator": None}}, path)
    return path, argv


def test_checkpoint_trained_without_scaling_is_evaluated_with_it_at_4x_the_length(tmp_path):
    """What fairseq-validate --model-overrides "{'max_positions': 128, 'rotary_scaling': 'linear',
    'rotary_scaling_factor': 4.0}" loads."""
    path, _ = _save_trained_without_scaling(tmp_path)
    tokens = random_tokens(make_dictionary(), [4 * TRAIN_LENGTH, 3 * TRAIN_LENGTH])
    features = {}
    for scaling in ("none", "linear", "ntk"):
        overrides = {"data": str(tmp_path), "max_positions": 4 * TRAIN_LENGTH}
        if scaling != "none":
            overrides.update(rotary_scaling=scaling, rotary_scaling_factor=4.0)
        (model,), _ = checkpoint_utils.load_model_ensemble([str(path)], arg_overrides=overrides)
        assert model.encoder.sentence_encoder.positional_term.rotary.scaling == scaling
        with torch.no_grad():
            features[scaling] = model.eval()(tokens, features_only=True)[0]
        assert torch.isfinite(features[scaling]).all()
    assert not torch.allclose(features["linear"], features["none"])
    assert not torch.allclose(features["ntk"], features["none"])


def test_loading_with_scaling_but_no_factor_is_refused_naming_the_flag(tmp_path):
    path, _ = _save_trained_without_scaling(tmp_path)
    overrides = {"data": str(tmp_path), "rotary_scaling": "linear"}
    with pytest.raises(PositionFlagError, match="--rotary-scaling linear needs --rotary-scaling-factor F"):
        checkpoint_utils.load_model_ensemble([str(path)], arg_overrides=overrides)


def test_fine_tuning_may_set_the_scaling_on_a_checkpoint_trained_without_it(tmp_path):
    path, argv = _save_trained_without_scaling(tmp_path)
    argv += ["--restore-file", str(path), "--rotary-scaling", "ntk", "--rotary-scaling-factor", "2"]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    prepare_training(cfg, argv)
    model = cfg.model
    assert (model.rotary, model.rotary_scaling, model.rotary_scaling_factor) == ("fixed", "ntk", 2.0)


@pytest.mark.parametrize("flags, message", [
    (dict(rotary_scaling="linear", rotary_scaling_factor=4.0),
     "--rotary-scaling linear scales RoPE's angles and --rotary is none; add --rotary fixed"),
    (dict(rotary="fixed", rotary_scaling="linear"),
     "--rotary-scaling linear needs --rotary-scaling-factor F > 1 .*; got 1.0"),
    (dict(rotary="fixed", rotary_scaling="ntk", rotary_scaling_factor=0.5), "F > 1 .*; got 0.5"),
    (dict(rotary="fixed", rotary_scaling="linear", rotary_scaling_factor=float("nan")),
     "--rotary-scaling-factor must be a finite number, got nan"),
    (dict(rotary="fixed", rotary_scaling="linear", rotary_scaling_factor=float("inf")),
     "--rotary-scaling-factor must be a finite number, got inf"),
    (dict(rotary="fixed", rotary_scaling_factor=4.0),
     "--rotary-scaling-factor 4.0 with --rotary-scaling none scales nothing; add --rotary-scaling linear"),
    (dict(rotary="learnable", rotary_scaling="ntk", rotary_scaling_factor=4.0),
     "--rotary-scaling ntk changes RoPE's fixed base and --rotary learnable .* use --rotary-scaling linear"),
    (dict(rotary="fixed", rotary_scaling="cubic"), "--rotary-scaling must be one of none, linear, ntk"),
])
def test_scaling_that_cannot_be_built_is_refused_by_name(flags, message):
    with pytest.raises(PositionFlagError, match=message):
        PositionConfig(embed_dim=64, num_heads=4, max_positions=8, **flags).check()


@pytest.mark.parametrize("flags, message", [
    (dict(rotary_scaling="ntk", rotary_scaling_factor=1e300),
     r"--rotary-scaling ntk with --rotary-scaling-factor 1e\+300 makes RoPE's base --rotary-base 10000 \* "
     r"F\^\(d_h/\(d_h-2\)\) \(d_h = 16\) larger than float32's largest number .*: they overflow"),
    (dict(rotary_scaling="ntk", rotary_scaling_factor=1e36),
     "--rotary-scaling-factor 1e\\+36 makes RoPE's base"),
    (dict(rotary_scaling="linear", rotary_scaling_factor=1e300),
     r"--rotary-scaling linear with --rotary-scaling-factor 1e\+300 divides every position by F to 0"),
    (dict(rotary_base=1e39), r"--rotary-base 1e\+39 is larger than float32's largest number"),
])
def test_a_scaling_whose_angles_leave_float32_is_refused_naming_the_flag(flags, message):
    with pytest.raises(PositionFlagError, match=message):
        PositionConfig(embed_dim=64, num_heads=4, max_positions=8, rotary="fixed", **flags).check()


def test_an_override_of_a_factor_whose_angles_overflow_is_refused_in_one_line(tmp_path):
    """What fairseq-validate --model-overrides "{'rotary_scaling': 'ntk', 'rotary_scaling_factor': 1e300}"
    loads: refused as the model is built (was: OverflowError)."""
    path, _ = _save_trained_without_scaling(tmp_path)
    overrides = {"data": str(tmp_path), "rotary_scaling": "ntk", "rotary_scaling_factor": 1e300}
    with pytest.raises(PositionFlagError, match="--rotary-scaling-factor 1e\\+300 makes RoPE's base"):
        checkpoint_utils.load_model_ensemble([str(path)], arg_overrides=overrides)


def test_ntk_needs_a_head_dimension_above_2():
    with pytest.raises(PositionFlagError, match="--rotary-scaling ntk needs a head dimension > 2"):
        PositionConfig(embed_dim=8, num_heads=4, max_positions=8, rotary="fixed", rotary_scaling="ntk",
                       rotary_scaling_factor=2.0).check()


@pytest.mark.slow
def test_fairseq_validate_takes_the_scaling_as_model_overrides_at_4x_the_training_length(wikitext_bin,
                                                                                         tmp_path):
    """fairseq-train without scaling at 32 tokens, then fairseq-validate at 128 with linear and ntk; a
    scaling without its factor stops fairseq-validate naming the flag (the overrides reach the model)."""
    validate = [wikitext_bin, "--user-dir", "tupe_plugin", "--path", tmp_path / "checkpoint_last.pt",
                "--task", "masked_lm", "--tokens-per-sample", 4 * TRAIN_LENGTH, "--batch-size", 4, "--cpu",
                "--num-workers", 0, "--model-overrides"]
    overrides = "{{'max_positions': 128, 'rotary_scaling': '{}'{}}}"
    outputs, returncode = run_fairseq_steps(
        ("train", train_args(wikitext_bin, tmp_path, "bert_rope_tiny", 2,
                             "--tokens-per-sample", TRAIN_LENGTH)),
        ("validate", validate + [overrides.format("linear", ", 'rotary_scaling_factor': 4.0")]),
        ("validate", validate + [overrides.format("ntk", ", 'rotary_scaling_factor': 4.0")]),
        ("validate", validate + [overrides.format("linear", "")]),
        check=False,
    )
    assert len(outputs) == 4, outputs[-1][-3000:]
    for output in outputs[1:3]:
        (loss,) = logged_losses(output, "valid")
        assert math.isfinite(loss)
    assert returncode != 0
    assert "error: invalid model flags" in outputs[3]
    assert "--rotary-scaling linear needs --rotary-scaling-factor F > 1" in outputs[3]


def test_analysis_profile_of_a_linearly_scaled_model_is_the_unscaled_one_stretched_by_f(dictionary):
    plain = build_model("bert_rope_tiny", dictionary)
    scaled = build_model("bert_rope_tiny", dictionary, rotary_scaling="linear", rotary_scaling_factor=4.0)
    torch.testing.assert_close(rotary_offset_matrix(scaled, 32)[0, ::4], rotary_offset_matrix(plain, 8)[0])
