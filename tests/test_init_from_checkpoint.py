"""--init-from-checkpoint: a pre-trained model's weights start a new run of another position encoding
and fairseq's own RoBERTa checkpoints load as bert_a_*.

The swaps are unit-level: tiny models built in-process the way fairseq-train builds them, checkpoints
saved with the config fairseq stores. Two fairseq-train processes: the stock RoBERTa checkpoint (2
updates of ``--arch roberta_base`` at tiny size), and a swap run interrupted and rerun.
"""

import logging
import os
import shutil

import pytest
import torch
from cli import run_fairseq, run_fairseq_steps, train_args
from conftest import REPO, _Task, build_model, make_dictionary, random_tokens
from fairseq import checkpoint_utils, options
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from tupe_plugin.checkpoints.checkpoint_config import saved_model_config
from tupe_plugin.models.checkpoint_guards import CheckpointMismatchError, DictionaryMismatchError
from tupe_plugin.models.checkpoint_init import read_checkpoint
from tupe_plugin.policies.restore_architecture import ArchitectureMismatchError, prepare_training
from tupe_plugin.policies.swap_resume import SwapFlagError, prepare_swap

ENCODER = "encoder.sentence_encoder."
ABSOLUTE = ENCODER + "embed_positions.weight"
UNTIED = ENCODER + "positional_term.untied_position.embed_positions.weight"


def save_checkpoint(path, arch, dictionary=None, **flags):
    """A tiny plugin model saved as fairseq saves it: (its state dict, path)."""
    model = build_model(arch, dictionary or make_dictionary(), **flags)
    torch.save({"cfg": {"model": model.args}, "model": model.state_dict()}, path)
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}, str(path)


def fresh_and_swapped(arch, path, seed=3, dictionary=None, **flags):
    """The model ``arch`` built without and with --init-from-checkpoint ``path``, from the same seed."""
    torch.manual_seed(seed)
    fresh = build_model(arch, dictionary or make_dictionary(), **flags)
    torch.manual_seed(seed)
    swapped = build_model(arch, dictionary or make_dictionary(), init_from_checkpoint=path, **flags)
    return fresh.state_dict(), swapped.state_dict()


SWAPS = {
    # arch: (newly initialised, logged group of the new ones)
    "tupe_r_tiny": ("positional_term.untied_position.cls_vectors, positional_term.untied_position."
                    "embed_positions.weight, positional_term.untied_position.layer_norm.weight, "
                    "positional_term.untied_position.layer_norm.bias, positional_term.untied_position."
                    "q_proj.weight, positional_term.untied_position.k_proj.weight, "
                    "positional_term.relative_bias.relative_attention_bias.weight"),
    "bert_rope_tiny": "positional_term.rotary.sinusoid.frequencies",
    "bert_alibi_tiny": "none",
    "bert_rpe_tiny": "positional_term.shaw.weight",
}


@pytest.mark.parametrize("arch", SWAPS)
def test_swap_from_bert_a_copies_shared_tensors_keeps_new_ones_at_init_and_logs_each_group(
        arch, tmp_path, caplog):
    source, path = save_checkpoint(tmp_path / "bert_a.pt", "bert_a_tiny")
    with caplog.at_level(logging.INFO, logger="tupe_plugin.models.checkpoint_init"):
        fresh, swapped = fresh_and_swapped(arch, path)
    for name, tensor in swapped.items():
        expected = source[name] if name in source else fresh[name]
        torch.testing.assert_close(tensor, expected, rtol=0, atol=0, msg=name)
    assert any(not torch.equal(fresh[name], source[name]) for name in source if name in fresh)
    lines = [record.getMessage() for record in caplog.records]
    assert f"--init-from-checkpoint {path}: copied {len(source) - 1} tensors: word embeddings, " \
           "layers 0-1, LM head, embedding LayerNorm" in lines
    assert f"--init-from-checkpoint {path}: newly initialised: {SWAPS[arch]}" in lines
    assert f"--init-from-checkpoint {path}: dropped from the checkpoint: embed_positions.weight" in lines


def layer_norm_epsilons(model):
    return {module.eps for module in model.modules() if isinstance(module, torch.nn.LayerNorm)}


def test_the_checkpoints_layer_norm_eps_is_carried_unless_the_command_line_gives_one(tmp_path, caplog):
    _, path = save_checkpoint(tmp_path / "bert.pt", "bert_a_tiny", layer_norm_eps=1e-12)
    with caplog.at_level(logging.INFO, logger="tupe_plugin.models.checkpoint_init"):
        carried = build_model("tupe_r_tiny", make_dictionary(), init_from_checkpoint=path)
    assert carried.args.layer_norm_eps == 1e-12 and layer_norm_epsilons(carried) == {1e-12}
    assert f"--init-from-checkpoint {path}: its LayerNorm epsilon 1e-12 carried (--layer-norm-eps to give " \
           "another)" in caplog.text
    given = build_model("tupe_r_tiny", make_dictionary(), init_from_checkpoint=path, layer_norm_eps=1e-6)
    assert layer_norm_epsilons(given) == {1e-6}


@pytest.mark.parametrize("extra, expected_rows", [("init", "fresh"), ("copy-repeat", "repeated")])
def test_a_learned_table_moves_to_a_longer_one_copying_its_rows(extra, expected_rows, tmp_path, caplog):
    source, path = save_checkpoint(tmp_path / "bert_a_32.pt", "bert_a_tiny", max_positions=32)
    with caplog.at_level(logging.INFO, logger="tupe_plugin.models.checkpoint_init"):
        fresh, swapped = fresh_and_swapped("bert_a_tiny", path, max_positions=80, init_extra_positions=extra)
    table = swapped[ABSOLUTE]
    torch.testing.assert_close(table[:32], source[ABSOLUTE], rtol=0, atol=0)
    rest = fresh[ABSOLUTE][32:] if expected_rows == "fresh" else source[ABSOLUTE].repeat(3, 1)[32:80]
    torch.testing.assert_close(table[32:], rest, rtol=0, atol=0)
    how = "are initialised fresh" if extra == "init" else "repeat the checkpoint's rows"
    assert f"--init-from-checkpoint {path}: embed_positions.weight: the checkpoint's 32 rows copied, " \
           f"rows 32-79 {how} (--init-extra-positions {extra})" in caplog.text


def test_the_untied_table_starts_from_the_absolute_one_with_the_option(tmp_path, caplog):
    source, path = save_checkpoint(tmp_path / "bert_a.pt", "bert_a_tiny")
    with caplog.at_level(logging.INFO, logger="tupe_plugin.models.checkpoint_init"):
        fresh, swapped = fresh_and_swapped("tupe_r_tiny", path, init_untied_from_absolute=True)
    torch.testing.assert_close(swapped[UNTIED], source[ABSOLUTE], rtol=0, atol=0)
    assert "the untied position table starts from the checkpoint's absolute table: the checkpoint's 32 " \
           "rows copied (--init-untied-from-absolute)" in caplog.text
    assert "dropped from the checkpoint: none" in caplog.text
    _, unswapped = fresh_and_swapped("tupe_r_tiny", path)
    torch.testing.assert_close(unswapped[UNTIED], fresh[UNTIED], rtol=0, atol=0)


@pytest.mark.parametrize("flags, message", [
    (dict(encoder_ffn_embed_dim=64), r"layers.0.fc1.weight is \(512, 128\) in the checkpoint but "
                                     r"\(64, 128\) in the model of this command; give the size flags"),
    (dict(dictionary=make_dictionary(50)), r"embed_tokens.weight is \(45, 128\) in the checkpoint but "
                                           r"\(55, 128\) .*another vocabulary: binarize the data against"),
])
def test_a_shared_tensor_of_another_shape_stops_naming_it_and_both_shapes(flags, message, tmp_path):
    _, path = save_checkpoint(tmp_path / "bert_a.pt", "bert_a_tiny")
    dictionary = flags.pop("dictionary", make_dictionary())
    with pytest.raises(CheckpointMismatchError, match=f"--init-from-checkpoint {path}: {ENCODER}{message}"):
        build_model("tupe_r_tiny", dictionary, init_from_checkpoint=path, **flags)


def test_a_dictionary_of_the_same_size_with_other_symbols_is_refused(tmp_path):
    _, path = save_checkpoint(tmp_path / "bert_a.pt", "bert_a_tiny")
    other = Dictionary()
    for i in range(40):
        other.add_symbol(f"v{i}")
    other.add_symbol("<mask>")
    with pytest.raises(DictionaryMismatchError, match="was trained with another dictionary"):
        build_model("tupe_r_tiny", other, init_from_checkpoint=path)


def test_a_model_rebuilt_from_its_saved_config_does_not_read_the_checkpoint_again(tmp_path):
    _, path = save_checkpoint(tmp_path / "bert_a.pt", "bert_a_tiny")
    model = build_model("tupe_r_tiny", init_from_checkpoint=path)
    os.remove(path)
    assert model.args.init_from_checkpoint_applied
    from tupe_plugin.models import TupeRobertaModel

    TupeRobertaModel.build_model(model.args, _Task(make_dictionary(), 32))  # as fairseq-validate does


def command(save_dir, *extra):
    return ["DATA", "--user-dir", os.path.join(REPO, "tupe_plugin"), "--task", "masked_lm", "--arch",
            "tupe_r_tiny", "--tokens-per-sample", "32", "--save-dir", str(save_dir), *map(str, extra)]


def prepared(argv):
    """fairseq-train's config for ``argv`` after the plugin's pre-build checks of checkpoints."""
    cfg = convert_namespace_to_omegaconf(
        options.parse_args_and_arch(options.get_training_parser(), input_args=argv))
    prepare_swap(cfg)
    prepare_training(cfg, argv)
    return cfg


def test_a_rerun_resumes_from_its_own_checkpoint_last_without_reading_ckpt(tmp_path):
    _, path = save_checkpoint(tmp_path / "bert_a.pt", "bert_a_tiny")
    new_run = prepared(command(tmp_path / "run", "--init-from-checkpoint", path))
    assert not new_run.model.init_from_checkpoint_applied
    (tmp_path / "run").mkdir()
    save_checkpoint(tmp_path / "run" / "checkpoint_last.pt", "tupe_r_tiny")
    os.remove(path)  # a rerun needs CKPT no more
    cfg = prepared(command(tmp_path / "run", "--init-from-checkpoint", path))
    assert cfg.model.init_from_checkpoint_applied


@pytest.mark.parametrize("other", ["--restore-file", "--finetune-from-model"])
def test_init_from_checkpoint_beside_another_loading_flag_is_refused(other, tmp_path):
    _, path = save_checkpoint(tmp_path / "bert_a.pt", "bert_a_tiny")
    with pytest.raises(SwapFlagError, match=f"--init-from-checkpoint {path} and {other} {path} both load"):
        prepared(command(tmp_path / "run", "--init-from-checkpoint", path, other, path))


def test_a_missing_init_checkpoint_is_refused_before_the_model_is_built(tmp_path):
    with pytest.raises(CheckpointMismatchError, match="--init-from-checkpoint typo.pt does not exist"):
        prepared(command(tmp_path / "run", "--init-from-checkpoint", "typo.pt"))


def test_restoring_another_arch_without_the_flag_names_the_swap_flag(tmp_path):
    _, path = save_checkpoint(tmp_path / "bert_a.pt", "bert_a_tiny")
    with pytest.raises(ArchitectureMismatchError, match=f"{path} does not fit this command: .*fine-tune with "
                       f"--arch bert_a_tiny .*start a new run with --init-from-checkpoint {path} instead of "
                       "--restore-file"):
        prepared(command(tmp_path / "run", "--restore-file", path))


# ------------------------------------------------------------------------- fairseq's own RoBERTa checkpoints


@pytest.fixture(scope="module")
def stock_roberta(wikitext_bin, tmp_path_factory):
    """A checkpoint of fairseq's RobertaModel (--arch roberta_base at tiny size), trained for 2 updates."""
    save_dir = tmp_path_factory.mktemp("stock_roberta")
    run_fairseq("train", wikitext_bin, "--task", "masked_lm", "--criterion", "masked_lm",
                "--arch", "roberta_base", "--encoder-layers", 2, "--encoder-embed-dim", 128,
                "--encoder-attention-heads", 4, "--encoder-ffn-embed-dim", 512, "--tokens-per-sample", 64,
                "--batch-size", 8, "--max-update", 2, "--optimizer", "adam", "--lr", 1e-3,
                "--save-dir", save_dir, "--cpu", "--seed", 1, "--num-workers", 0, "--no-epoch-checkpoints")
    return save_dir / "checkpoint_last.pt"


def test_fairseq_roberta_checkpoint_loads_as_bert_a_with_the_same_outputs(stock_roberta):
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(stock_roberta)])
    stock = models[0].eval()
    plugin = build_model("bert_a_tiny", task.source_dictionary, max_positions=64).eval()
    plugin.load_state_dict(torch.load(stock_roberta, map_location="cpu")["model"])
    tokens = random_tokens(task.source_dictionary, [64, 40, 9], seed=1)
    real = tokens.ne(task.source_dictionary.pad())
    with torch.no_grad():
        for features_only in (True, False):
            expected = stock(tokens, features_only=features_only)[0]
            actual = plugin(tokens, features_only=features_only)[0]
            torch.testing.assert_close(actual[real], expected[real], rtol=0, atol=1e-5)


def test_the_released_roberta_names_load_like_todays(stock_roberta):
    """roberta.base's model.pt: decoder.*, emb_layer_norm, the attention's stacked in_proj_weight."""
    stock = torch.load(stock_roberta, map_location="cpu")["model"]
    released = {}
    for name, tensor in stock.items():
        old = name.replace("encoder.", "decoder.", 1).replace(".layernorm_embedding.", ".emb_layer_norm.")
        if ".self_attn.q_proj." in name:
            parts = [stock[name.replace("q_proj", f"{part}_proj")] for part in "qkv"]
            released[old.replace("q_proj.", "in_proj_")] = torch.cat(parts)
        elif ".self_attn.k_proj." not in name and ".self_attn.v_proj." not in name:
            released[old] = tensor
    dictionary = checkpoint_utils.load_model_ensemble_and_task([str(stock_roberta)])[2].source_dictionary
    today, before = (build_model("bert_a_tiny", dictionary, max_positions=64) for _ in range(2))
    today.load_state_dict(stock)
    before.load_state_dict(released)
    for name, tensor in today.state_dict().items():
        torch.testing.assert_close(before.state_dict()[name], tensor, rtol=0, atol=0, msg=name)


def test_a_roberta_file_in_torchs_legacy_format_is_read(stock_roberta, tmp_path):
    """The released roberta.base predates torch's zip format (no mmap)."""
    legacy = tmp_path / "model.pt"
    torch.save(torch.load(stock_roberta, map_location="cpu"), legacy, _use_new_zipfile_serialization=False)
    assert saved_model_config(str(legacy)).arch == "roberta_base"
    weights, _ = read_checkpoint(str(legacy), padding_idx=1)
    assert weights[ENCODER + "embed_positions.weight"].shape == (64, 128)


def test_fairseq_roberta_checkpoint_is_a_swap_source(stock_roberta, wikitext_bin):
    dictionary = Dictionary.load(str(wikitext_bin / "dict.txt"))
    dictionary.add_symbol("<mask>")
    stock = torch.load(stock_roberta, map_location="cpu")["model"]
    state = build_model("tupe_r_tiny", dictionary, max_positions=64,
                        init_from_checkpoint=str(stock_roberta)).state_dict()
    in_proj = torch.cat([stock[ENCODER + f"layers.1.self_attn.{part}_proj.weight"] for part in "qkv"])
    torch.testing.assert_close(state[ENCODER + "layers.1.self_attn.in_proj.weight"], in_proj, rtol=0, atol=0)
    for name in ("embed_tokens.weight", "layernorm_embedding.bias", "layers.0.fc2.weight"):
        torch.testing.assert_close(state[ENCODER + name], stock[ENCODER + name], rtol=0, atol=0)
    torch.testing.assert_close(state["encoder.lm_head.dense.weight"], stock["encoder.lm_head.dense.weight"])


def test_an_interrupted_swap_run_resumes_from_its_own_checkpoint(stock_roberta, wikitext_bin, tmp_path):
    ckpt = tmp_path / "roberta.pt"
    shutil.copy(stock_roberta, ckpt)
    swap = ["--init-from-checkpoint", ckpt, "--max-positions", 64]
    first, rerun = run_fairseq_steps(  # the rerun of an interrupted run: the same command, a later end
        ("train", train_args(wikitext_bin, tmp_path / "swap", "tupe_r_tiny", 1, *swap)),
        ("train", train_args(wikitext_bin, tmp_path / "swap", "tupe_r_tiny", 2, *swap)),
    )
    assert f"--init-from-checkpoint {ckpt}: copied" in first and "No existing checkpoint found" in first
    last = tmp_path / "swap" / "checkpoint_last.pt"
    assert f"the run resumes from its own {last}: --init-from-checkpoint {ckpt} is not read again" in rerun
    assert f"--init-from-checkpoint {ckpt}: copied" not in rerun
    assert f"Loaded checkpoint {last} (epoch 1 @ 1 updates)" in rerun and "num_updates 2" in rerun
