"""fairseq-train with --restore-file builds the checkpoint's architecture, and a missing file stops it.

The command lines are parsed by fairseq's own parser (as fairseq-train does) and handed to the hook that
runs before fairseq-train builds the model; the checkpoints are tiny models saved with the config fairseq
stores (``cfg.model``).
"""

import os

import pytest
import torch
from cli import run_fairseq_steps, train_args
from conftest import REPO, _Task, build_model, make_dictionary, random_tokens
import fairseq_cli.train
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from tupe_plugin.models import TupeRobertaModel
from tupe_plugin.policies.missing_restore_file import MissingRestoreFileError
from tupe_plugin.policies.restore_architecture import ArchitectureMismatchError, prepare_training

MAX_POSITIONS = 32


def save_pretrained(path, arch, **flags):
    """A tiny plugin model built with ``flags`` and saved as fairseq saves it: (model, path)."""
    model = build_model(arch, make_dictionary(), max_positions=MAX_POSITIONS, **flags)
    torch.save({"cfg": {"model": model.args}, "model": model.state_dict()}, path)
    return model, path


def fine_tuning_command(restore_file, arch, *extra):
    return ["DATA", "--user-dir", os.path.join(REPO, "tupe_plugin"), "--task", "masked_lm", "--arch", arch,
            "--restore-file", str(restore_file), "--tokens-per-sample", str(MAX_POSITIONS),
            "--batch-size", "2", "--dropout", "0", "--attention-dropout", "0", *map(str, extra)]


def prepared(argv):
    """fairseq-train's config for ``argv`` after the plugin's pre-build hook."""
    cfg = convert_namespace_to_omegaconf(
        options.parse_args_and_arch(options.get_training_parser(), input_args=argv))
    prepare_training(cfg, argv)
    return cfg


PRE_TRAINING_FLAGS = {
    # flags that change no parameter shape
    "rel-pos-max-distance": ("tupe_r_tiny", dict(rel_pos_max_distance=16)),
    "activation-fn": ("tupe_r_tiny", dict(activation_fn="relu")),
    "encoder-normalize-before": ("bert_a_tiny", dict(encoder_normalize_before=True)),
    "shaw-keys-only and shaw-max-distance": ("bert_rpe_tiny", dict(shaw_keys_only=True, shaw_max_distance=4)),
    "several at once": ("tupe_r_tiny", dict(rel_pos_buckets=16, rel_pos_max_distance=40,
                                            no_layernorm_embedding=True, activation_fn="tanh")),
    # and one that does
    "encoder-ffn-embed-dim": ("bert_a_tiny", dict(encoder_ffn_embed_dim=64)),
}


@pytest.mark.parametrize("case", PRE_TRAINING_FLAGS)
def test_fine_tuning_without_the_pre_training_flags_computes_what_the_checkpoint_did(case, tmp_path):
    arch, flags = PRE_TRAINING_FLAGS[case]
    pretrained, path = save_pretrained(tmp_path / "pretrained.pt", arch, **flags)
    cfg = prepared(fine_tuning_command(path, arch))
    dictionary = make_dictionary()
    model = TupeRobertaModel.build_model(cfg.model, _Task(dictionary, MAX_POSITIONS))
    model.load_state_dict(pretrained.state_dict())
    tokens = random_tokens(dictionary, [12, 7])
    torch.testing.assert_close(model.eval()(tokens)[0], pretrained.eval()(tokens)[0], rtol=0, atol=0)


@pytest.mark.parametrize("pretraining, given, message", [
    (dict(activation_fn="relu"), ["--activation-fn", "gelu"],
     "--activation-fn gelu is given but the checkpoint has --activation-fn relu"),
    (dict(rel_pos_max_distance=16), ["--rel-pos-max-distance", 64],
     "--rel-pos-max-distance 64 is given but the checkpoint has --rel-pos-max-distance 16"),
    (dict(), ["--encoder-normalize-before"],
     "--encoder-normalize-before is given but the checkpoint has no --encoder-normalize-before"),
    (dict(), ["--encoder-layers=3"], "--encoder-layers 3 is given but the checkpoint has --encoder-layers 2"),
    (dict(), ["--no-layernorm-embedding"],
     "--no-layernorm-embedding is given but the checkpoint has --layernorm-embedding"),
])
def test_a_given_flag_that_differs_from_the_checkpoint_is_refused_naming_both_values(
        pretraining, given, message, tmp_path):
    _, path = save_pretrained(tmp_path / "pretrained.pt", "tupe_r_tiny", **pretraining)
    with pytest.raises(ArchitectureMismatchError, match=f"{path} does not fit this command: .*{message}"
                                                        ".*fine-tune with --arch tupe_r_tiny"):
        prepared(fine_tuning_command(path, "tupe_r_tiny", *given))


def test_a_given_flag_equal_to_what_the_checkpoint_left_unset_uses_is_accepted(tmp_path):
    """A checkpoint without --layer-norm-eps uses fairseq's LayerNorm default: giving that value computes the
    same."""
    _, path = save_pretrained(tmp_path / "pretrained.pt", "tupe_r_tiny")
    cfg = prepared(fine_tuning_command(path, "tupe_r_tiny", "--layer-norm-eps", "1e-5"))
    assert cfg.model.layer_norm_eps == 1e-5


def test_a_given_flag_other_than_what_the_checkpoint_left_unset_uses_is_refused(tmp_path):
    _, path = save_pretrained(tmp_path / "pretrained.pt", "tupe_r_tiny")
    with pytest.raises(ArchitectureMismatchError,
                       match="--layer-norm-eps 0.001 is given but the checkpoint has"):
        prepared(fine_tuning_command(path, "tupe_r_tiny", "--layer-norm-eps", "1e-3"))


@pytest.mark.parametrize("pretrained_arch, arch, message", [
    ("tupe_r_tiny", "tupe_a_tiny", "--arch tupe_a_tiny gives --rel-pos none but the checkpoint "
                                   r"\(--arch tupe_r_tiny\) has --rel-pos t5"),
    # same parameter names, other equations: loaded without complaint before
    ("tupe_a_tie_cls_tiny", "bert_a_d_tiny",
     "--arch bert_a_d_tiny gives --untied-pos four-term but the "
     r"checkpoint \(--arch tupe_a_tie_cls_tiny\) has --untied-pos tupe"),
    ("bert_a_tiny", "tupe_r_base", "--arch tupe_r_base gives --encoder-embed-dim 768 but the checkpoint "
                                   r"\(--arch bert_a_tiny\) has --encoder-embed-dim 128"),
])
def test_another_arch_is_refused_naming_the_setting_it_changes(pretrained_arch, arch, message, tmp_path):
    _, path = save_pretrained(tmp_path / "pretrained.pt", pretrained_arch)
    with pytest.raises(ArchitectureMismatchError, match=message):
        prepared(fine_tuning_command(path, arch))


@pytest.mark.parametrize("pretrained_arch, arch", [("tupe_r_tiny", "tupe_roberta"),
                                                   ("bert_a_tiny", "bert_a_base")])
def test_another_arch_name_with_the_same_settings_is_accepted(pretrained_arch, arch, tmp_path):
    _, path = save_pretrained(tmp_path / "pretrained.pt", pretrained_arch)
    tiny_sizes = ["--encoder-layers", 2, "--encoder-embed-dim", 128, "--encoder-attention-heads", 4,
                  "--encoder-ffn-embed-dim", 512]
    cfg = prepared(fine_tuning_command(path, arch, *tiny_sizes))  # no --max-positions: carried
    assert cfg.model.max_positions == MAX_POSITIONS


@pytest.mark.parametrize("flag, value", [("--dropout", 0.3), ("--attention-dropout", 0.2),
                                         ("--pooler-dropout", 0.4)])
def test_regularisation_flags_may_differ_at_fine_tuning(flag, value, tmp_path):
    _, path = save_pretrained(tmp_path / "pretrained.pt", "tupe_r_tiny")
    cfg = prepared(fine_tuning_command(path, "tupe_r_tiny", flag, value))
    assert getattr(cfg.model, flag[2:].replace("-", "_")) == value


def test_unset_regularisation_is_carried_from_the_checkpoint(tmp_path):
    _, path = save_pretrained(tmp_path / "pretrained.pt", "tupe_r_tiny", activation_dropout=0.25)
    assert prepared(fine_tuning_command(path, "tupe_r_tiny")).model.activation_dropout == 0.25


@pytest.mark.parametrize("restore_file", ["checkpoints/chekpoint_best.pt", "no-such-dir/checkpoint_last.pt",
                                          "pretrained.pt.bak"])
def test_a_missing_restore_file_stops_the_run_naming_it(restore_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save_pretrained(tmp_path / "pretrained.pt", "tupe_r_tiny")
    with pytest.raises(MissingRestoreFileError, match=f"--restore-file {restore_file} does not exist "
                                                      r"\(fairseq would train from random initialisation\)"):
        prepared(fine_tuning_command(restore_file, "tupe_r_tiny"))


def test_fairseq_train_refuses_a_missing_restore_file_before_building_the_model(tmp_path):
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(
        options.get_training_parser(), input_args=fine_tuning_command(tmp_path / "typo.pt", "tupe_r_tiny")))
    with pytest.raises(MissingRestoreFileError, match="typo.pt does not exist"):
        fairseq_cli.train.add_defaults(cfg)  # the step of fairseq-train's main that runs the plugin's checks


def test_a_new_run_without_restore_file_needs_no_checkpoint(tmp_path):
    argv = fine_tuning_command("checkpoint_last.pt", "tupe_r_tiny", "--save-dir", tmp_path / "new")
    assert prepared(argv).model.rel_pos_max_distance == 128


@pytest.mark.slow
def test_fine_tuning_command_line_keeps_the_pre_training_flags_and_stops_on_a_typo(wikitext_bin, tmp_path):
    pretrain, finetune = tmp_path / "pretrain", tmp_path / "finetune"
    outputs, code = run_fairseq_steps(
        ("train", train_args(wikitext_bin, pretrain, "tupe_r_tiny", 1, "--rel-pos-max-distance", 16,
                             "--activation-fn", "relu")),
        ("train", train_args(wikitext_bin, finetune, "tupe_r_tiny", 2, "--restore-file",
                             pretrain / "checkpoint_last.pt", "--reset-optimizer")),
        ("train", train_args(wikitext_bin, tmp_path / "typo", "tupe_r_tiny", 1, "--restore-file",
                             pretrain / "checkpoint_lst.pt")),
        check=False,
    )
    assert len(outputs) == 3 and code != 0, outputs[-1][-3000:]
    assert "carried from" in outputs[1] and "--rel-pos-max-distance 16" in outputs[1]
    saved = torch.load(finetune / "checkpoint_last.pt", map_location="cpu")["cfg"]["model"]
    assert (saved.rel_pos_max_distance, saved.activation_fn) == (16, "relu")
    assert f"--restore-file {pretrain / 'checkpoint_lst.pt'} does not exist" in outputs[2]
    assert not (tmp_path / "typo" / "checkpoint_last.pt").exists()
