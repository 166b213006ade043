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
    with pytest.raises(PositionFlagError,
                       match=f"--max-positions {max_positions} would need a .* GiB position "
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
    with pytest.raises(NotAFairseqCheckpointError,
                       match=f"{path} is a torch file but not a fairseq checkpoint "
                             f"\\(it holds {held}"):
        checkpoint_utils.load_model_ensemble_and_task([str(path)])


def test_bf16_on_a_tpu_machine_is_left_to_fairseqs_tpu_path(monkeypatch):
    from tupe_plugin.policies import training_flag_checks

    monkeypatch.setattr(training_flag_checks, "_has_xla", lambda: True)
    check_training_flags(training_cfg("--tpu", "--bf16", "--cpu"))


GIB = 2**30


@pytest.fixture
def memory(monkeypatch):
    """The machine's memory, set by the test: ``memory(gib)``."""
    from tupe_plugin.models import model_flags
    from tupe_plugin.user_input import memory_limits

    def set_memory(gib):
        for module in (memory_limits, model_flags):
            monkeypatch.setattr(module, "machine_memory", lambda: int(gib * GIB), raising=False)
    return set_memory


@pytest.mark.parametrize("sizes, flag", [
    (dict(encoder_layers=100_000_000), "--encoder-layers 100000000"),
    (dict(encoder_layers=1001), "--encoder-layers 1001"),
    (dict(encoder_attention_heads=2048, encoder_embed_dim=2048), "--encoder-attention-heads 2048"),
    (dict(encoder_embed_dim=10**6, encoder_attention_heads=4), "--encoder-embed-dim 1000000"),
    (dict(encoder_ffn_embed_dim=10**6), "--encoder-ffn-embed-dim 1000000"),
])
def test_a_model_size_far_beyond_any_published_model_is_refused_whatever_the_memory(memory, sizes, flag):
    memory(10**9)  # a machine of an exbibyte
    with pytest.raises(PositionFlagError, match=f"{flag} is far beyond any published model .*: a typo\\?$"):
        build_model("tupe_r_tiny", make_dictionary(), **sizes)


@pytest.mark.parametrize("arch, sizes, flag, what", [
    ("tupe_r_tiny", dict(encoder_layers=1000), "--encoder-layers 1000", "feed-forward layer"),
    ("tupe_r_tiny", dict(encoder_ffn_embed_dim=100_000, encoder_layers=12), "--encoder-ffn-embed-dim 100000",
     "feed-forward layer"),
    ("tupe_r_tiny", dict(encoder_embed_dim=8192, encoder_attention_heads=4), "--encoder-embed-dim 8192",
     "q, k and v"),
    # by the forward's work: 64 x 512 tokens, 1024 heads of Shaw's keys gathered into a (B, H, T, T) mask
    ("bert_rpe_tiny", dict(encoder_embed_dim=1024, encoder_attention_heads=1024, batch_size=64,
                           tokens_per_sample=512, max_positions=512), "--encoder-attention-heads 1024",
     r"relative terms gathered into a \(B, H, T, T\) mask \(64 x 512 tokens x 1024 heads x 512\)"),
    # by the batch: 16 sequences x 16384 tokens of 200,000 feed-forward units (few parameters)
    ("tupe_r_tiny", dict(encoder_ffn_embed_dim=200_000, encoder_layers=1, batch_size=16,
                         tokens_per_sample=16384, max_positions=16384), "--encoder-ffn-embed-dim 200000",
     r"feed-forward layer \(16 x 16384 tokens x 200000\)"),
])
def test_a_model_size_beyond_memory_is_refused_naming_the_flag_before_allocating(memory, arch, sizes, flag,
                                                                                 what):
    """The model's parameters with their gradients and Adam's two moments, and the largest activation of one
    forward of the configured batch, against the machine's memory (2 GiB here): one line naming the flag."""
    memory(2)
    refusal = (f"{flag} would need .* GiB: the model's parameters with their gradients and Adam's two "
               f"moments .* its {what}.* more than the 2.0 GiB of memory of this machine: a typo\\?")
    with pytest.raises(PositionFlagError, match=refusal):
        build_model(arch, make_dictionary(), **sizes)


def test_many_heads_without_a_dense_relative_mask_fit_where_their_mask_would_not(memory):
    """Without relative vectors gathered into a (B, H, T, T) mask, no path keeps the heads' logits of the
    batch: the same sizes as the refused Shaw model build."""
    memory(2)
    build_model("tupe_r_tiny", make_dictionary(), encoder_embed_dim=1024, encoder_attention_heads=1024,
                encoder_layers=1, batch_size=64, tokens_per_sample=512, max_positions=512)


@pytest.mark.parametrize("flags, shape", [
    (dict(max_positions=512, tokens_per_sample=128, batch_size=8, max_tokens=None), (8, 128)),
    (dict(max_positions=512, tokens_per_sample=128, batch_size=None, max_tokens=4096), (32, 128)),
    (dict(max_positions=512, tokens_per_sample=128, batch_size=64, max_tokens=4096), (32, 128)),
    (dict(max_positions=512), (1, 512)),  # no batch known: what the model holds at its longest input
    (dict(max_positions=512, tokens_per_sample=None, batch_size=None, max_tokens=None), (1, 512)),
])
def test_the_forward_the_sizes_are_counted_at_is_the_configured_batch(flags, shape):
    from argparse import Namespace

    from tupe_plugin.user_input.memory_limits import forward_shape

    forward = forward_shape(Namespace(encoder_layers=3, **flags))
    assert (forward.sequences, forward.length, forward.layers) == (*shape, 3)


@pytest.mark.parametrize("arch, sizes, flag, what", [
    # FIRE's weights fit (6 x 10^8 numbers in training: 9 GiB), its (2T - 1) x hidden activations do not
    ("bert_fire_tiny", dict(fire_hidden=100_000_000, max_positions=32), "--fire-hidden 100000000",
     r"FIRE hidden layer \(63 offsets x 100000000 activations"),
    ("bert_sandwich_tiny", dict(sandwich_dim=1_000_000, max_positions=4096), "--sandwich-dim 1000000",
     r"Sandwich angles \(8191 offsets x 500000"),
    # Shaw's table is 24 MiB; q's products with its rows are 64 x 512 tokens x 4 heads x 200001
    ("bert_rpe_tiny",
     dict(shaw_max_distance=100_000, batch_size=64, tokens_per_sample=512, max_positions=512),
     "--shaw-max-distance 100000",
     r"Shaw table \(200001 rows of 32\) and the queries' products with its rows "
     r"\(64 x 512 tokens x 4 heads x 200001\)"),
])
def test_an_encoding_size_whose_work_in_a_forward_exceeds_memory_is_refused_naming_the_flag(
        memory, arch, sizes, flag, what):
    """Each encoding's sizes count the work of one forward at the configured length and batch, not only the
    tensors the flag allocates: the machine (30 GiB here) holds each flag's parameters."""
    memory(30)
    refusal = f"{flag} would need a .* GiB {what}.*, more than the 30.0 GiB of memory of this machine: a typo"
    with pytest.raises(PositionFlagError, match=refusal):
        build_model(arch, make_dictionary(), **sizes)


def test_each_encodings_sizes_grow_with_the_forwards_length_and_batch():
    """The per-forward work each encoding declares, at T = 64 and T = 4096, B = 1 and B = 8: FIRE's
    (2T - 1) x hidden activations, Sandwich's (2T - 1) x d'/2 angles, Shaw's B x H x T x (2K + 1) products and
    DeBERTa's rows projected in each layer (at most 2T of them)."""
    from tupe_plugin.encodings.position_config import PositionConfig
    from tupe_plugin.user_input.memory_limits import ForwardShape

    shape = dict(embed_dim=128, num_heads=4, max_positions=8192)
    for encoding in ("fire", "sandwich", "shaw-learned", "deberta"):
        config = PositionConfig(**shape, rel_pos=encoding)
        short, long, batch = (sum(size[3] for size in config.sized_tensors(ForwardShape(batch, length, 12)))
                              for batch, length in ((1, 64), (1, 4096), (8, 4096)))
        assert short < long, encoding
        if encoding == "shaw-learned":
            assert batch > long
    fire = PositionConfig(**shape, rel_pos="fire", fire_hidden=1000)
    (_, _, _, nbytes, _), = fire.sized_tensors(ForwardShape(1, 4096, 12))
    assert nbytes >= 3 * (2 * 4096 - 1) * 1000 * 4
