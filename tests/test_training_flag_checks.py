"""fairseq-train flags and files that used to fail deep inside fairseq are refused in one line."""

import pytest
import torch
from conftest import build_model, make_dictionary
from fairseq import checkpoint_utils, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from tupe_plugin.policies.training_flag_checks import TrainingFlagError, check_training_flags
from tupe_plugin.fairseq_fixes.unreadable_checkpoints import NotAFairseqCheckpointError
from tupe_plugin.encodings.position_config import PositionFlagError


def training_cfg(*flags):
    argv = ["DATA", "--task", "masked_lm", "--arch", "tupe_r_tiny", "--batch-size", "2", *map(str, flags)]
    return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(),
                                                                      input_args=argv))


@pytest.mark.parametrize("flags, message", [
    (["--fp16", "--cpu"], r"--fp16 needs a CUDA GPU but the run is on the CPU \(--cpu\): drop --fp16"),
    (["--bf16", "--cpu"], r"--bf16 needs a CUDA GPU but the run is on the CPU \(--cpu\): drop --bf16"),
    (["--tokens-per-sample", 1], "--tokens-per-sample must be at least 2"),
    (["--tokens-per-sample", 0], "--tokens-per-sample must be at least 2"),
    (["--mask-prob", 0], r"--mask-prob is the fraction of tokens to predict, in \(0, 1\), got 0.0"),
    (["--mask-prob", 1], r"--mask-prob .* got 1.0"),
    (["--mask-prob", 1.5], r"--mask-prob .* got 1.5"),
])
def test_a_training_flag_that_cannot_train_is_refused_in_one_line(flags, message):
    with pytest.raises(TrainingFlagError, match=message):
        check_training_flags(training_cfg(*flags))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU")
def test_fp16_on_a_machine_without_cuda_is_refused_without_cpu_flag():
    with pytest.raises(TrainingFlagError, match="this machine, which has no CUDA device"):
        check_training_flags(training_cfg("--fp16"))


def test_the_usual_masked_lm_flags_pass():
    check_training_flags(training_cfg("--mask-prob", 0.15, "--tokens-per-sample", 512, "--cpu"))


@pytest.mark.parametrize("max_positions", [4_000_000_000, 10**10])  # TiB of table on any machine
def test_a_max_positions_typo_beyond_memory_is_refused_before_allocating(max_positions):
    with pytest.raises(PositionFlagError, match=f"--max-positions {max_positions} would need a .* GiB position "
                                                "table, more than the .* GiB of memory of this machine"):
        build_model("bert_a_tiny", make_dictionary(), max_positions=max_positions)


@pytest.mark.parametrize("arch, flag, table", [
    ("deberta_tiny", "deberta_max_distance", "relative table"),
    ("deberta_tiny", "deberta_buckets", "relative table"),
    ("bert_sandwich_tiny", "sandwich_dim", "Sandwich angles"),
    ("bert_fire_tiny", "fire_hidden", "FIRE hidden layer"),
    ("bert_rpe_tiny", "shaw_max_distance", "Shaw table"),
    ("tupe_r_tiny", "rel_pos_buckets", "T5 table"),
])
def test_an_encoding_size_typo_beyond_memory_is_refused_before_allocating(arch, flag, table):
    """Every size flag of the encodings, as --max-positions: 10^12 needs TiB at any shape."""
    sizes = {flag: 10**12, **({"deberta_max_distance": 10**13} if flag == "deberta_buckets" else {})}
    option = "--" + flag.replace("_", "-")
    with pytest.raises(PositionFlagError, match=f"{option} {10**12} would need a .* GiB {table} .*, more "
                                                "than the .* GiB of memory of this machine: a typo\\?"):
        build_model(arch, make_dictionary(), **sizes)


@pytest.mark.parametrize("content, held", [
    ("state dict", "a dict of 'encoder.sentence_encoder.embed_tokens.weight'"),
    ("tensor", "a Tensor"),
    ("list", "a list"),
])
def test_a_torch_file_that_is_not_a_fairseq_checkpoint_is_named(content, held, tmp_path):
    model = build_model("tupe_r_tiny", make_dictionary())
    obj = {"state dict": model.state_dict(), "tensor": torch.zeros(3), "list": [torch.zeros(2)]}[content]
    path = tmp_path / "model.pt"
    torch.save(obj, path)
    with pytest.raises(NotAFairseqCheckpointError, match=f"{path} is a torch file but not a fairseq checkpoint "
                                                         f"\\(it holds {held}"):
        checkpoint_utils.load_model_ensemble_and_task([str(path)])


def test_bf16_on_a_tpu_machine_is_left_to_fairseqs_tpu_path(monkeypatch):
    from tupe_plugin.policies import training_flag_checks

    monkeypatch.setattr(training_flag_checks, "_has_xla", lambda: True)
    check_training_flags(training_cfg("--tpu", "--bf16", "--cpu"))
