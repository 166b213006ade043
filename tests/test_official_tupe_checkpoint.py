"""tupe-convert-official: the authors' released TUPE-R checkpoint, converted and checked
against a plain implementation of the release's forward pass written here from
docs/official_tupe.md (not from the plugin's modules)."""

import argparse
import math
import os
import re
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from cli import logged_losses, run_fairseq, train_inner_losses
from conftest import build_model, random_tokens
from paper_equations import exact_t5_bucket
from fairseq import checkpoint_utils
from fairseq.data import Dictionary

from tupe_plugin.conversion import cli as convert_official_tupe
from tupe_plugin.conversion import official_tupe
from tupe_plugin.conversion.official_tupe import ReleaseCheckpointError, convert, release_key
from tupe_plugin.models import TupeRobertaModel
from tupe_plugin.encodings.position_config import PositionFlagError
from tupe_plugin.fairseq_fixes.checkpoint_compat import UnsafeCheckpointError
from tupe_plugin.encodings.relative_position import relative_position_bucket

S = "decoder.sentence_encoder."
LAYERS, DIM, HEADS, FFN, MAX_POSITIONS, BUCKETS = 2, 32, 4, 64, 24, 32
BOGUS_DATA = "/home/tupe-authors/data/wiki_book_32768"


# ---------------------------------------------------------------- the release, from docs/official_tupe.md

def release_bucket_matrix(seq_len):
    """rp_bucket as released: ordinary buckets, then column 0 := 32, then row 0 := 16."""
    buckets = [[exact_t5_bucket(j - i) for j in range(seq_len)] for i in range(seq_len)]
    for i in range(seq_len):
        buckets[i][0] = 32
    for j in range(seq_len):
        buckets[0][j] = 16
    return torch.tensor(buckets)


def layer_norm(x, sd, name):
    return F.layer_norm(x, x.shape[-1:], sd[name + ".weight"], sd[name + ".bias"], eps=1e-5)


def linear(x, sd, name):
    return x @ sd[name + ".weight"].t() + sd[name + ".bias"]


def release_forward(sd, tokens, pad, heads, post_ln=True):
    """The release's masked-LM forward: (hidden states per layer [(B, T, d)], logits (B, T, V))."""
    batch, seq_len = tokens.shape
    dim = sd[S + "embed_tokens.weight"].size(1)
    head_dim = dim // heads
    scale = (2 * head_dim) ** -0.5
    padding = tokens.eq(pad)

    x = sd[S + "embed_tokens.weight"][tokens]
    if S + "emb_layer_norm.weight" in sd:
        x = layer_norm(x, sd, S + "emb_layer_norm")
    x = x * (~padding)[..., None].float()

    # untied term over table rows 0..T (row t + 1 is position t), Linear WITH bias
    p = layer_norm(sd[S + "pos.weight"][: seq_len + 1], sd, S + "pos_ln")
    pos_q = linear(p, sd, S + "pos_q_linear").view(seq_len + 1, heads, head_dim) * scale
    pos_k = linear(p, sd, S + "pos_k_linear").view(seq_len + 1, heads, head_dim)
    absolute = torch.einsum("ahe,bhe->hab", pos_q, pos_k)
    theta_1, theta_2 = absolute[:, 0, 0], absolute[:, 1, 1]
    untied = absolute[:, 1:, 1:].clone()
    untied[:, :, 0] = theta_2[:, None]
    untied[:, 0, :] = theta_1[:, None]
    # relative term (TUPE-R): (33, H) table indexed by the reset bucket matrix, unscaled
    bias = untied
    if S + "relative_attention_bias.weight" in sd:
        table = sd[S + "relative_attention_bias.weight"]
        bias = untied + table[release_bucket_matrix(seq_len)].permute(2, 0, 1)

    hidden = [x]
    for n in range(LAYERS):
        layer = f"{S}layers.{n}."
        residual = x
        h = x if post_ln else layer_norm(x, sd, layer + "self_attn_layer_norm")
        qkv = h @ sd[layer + "self_attn.in_proj_weight"].t() + sd[layer + "self_attn.in_proj_bias"]
        q, k, v = qkv.chunk(3, dim=-1)
        heads_out = []
        for hd in range(heads):
            cols = slice(hd * head_dim, (hd + 1) * head_dim)
            logits = torch.einsum("bie,bje->bij", q[..., cols] * scale, k[..., cols]) + bias[hd]
            logits = logits.masked_fill(padding[:, None, :], float("-inf"))
            heads_out.append(torch.einsum("bij,bje->bie", torch.softmax(logits, -1), v[..., cols]))
        x = residual + linear(torch.cat(heads_out, -1), sd, layer + "self_attn.out_proj")
        if post_ln:
            x = layer_norm(x, sd, layer + "self_attn_layer_norm")
        residual = x
        h = x if post_ln else layer_norm(x, sd, layer + "final_layer_norm")
        x = residual + linear(F.gelu(linear(h, sd, layer + "fc1")), sd, layer + "fc2")
        if post_ln:
            x = layer_norm(x, sd, layer + "final_layer_norm")
        hidden.append(x)
    if not post_ln:
        x = hidden[-1] = layer_norm(x, sd, S + "emb_out_layer_norm")
    h = layer_norm(F.gelu(linear(x, sd, "decoder.lm_head.dense")), sd, "decoder.lm_head.layer_norm")
    logits = h @ sd["decoder.lm_head.weight"].t() + sd["decoder.lm_head.bias"]
    return hidden, logits


def release_state_dict(vocab, seed=0, embedding_ln=True, post_ln=True, fused_proj=False,
                       with_bucket_matrix=True, relative=True):
    """Random tensors under the release's key names and shapes (docs/official_tupe.md), tiny sizes."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, std=0.3):
        return torch.randn(*shape, generator=g) * std

    def norm(name):
        sd[name + ".weight"] = 1 + rand(DIM, std=0.1)
        sd[name + ".bias"] = rand(DIM, std=0.1)

    sd = {S + "embed_tokens.weight": rand(vocab, DIM)}
    if embedding_ln:
        norm(S + "emb_layer_norm")
    sd[S + "pos.weight"] = rand(MAX_POSITIONS + 1, DIM, std=1.0)
    norm(S + "pos_ln")
    if fused_proj:
        sd[S + "pos_proj.weight"], sd[S + "pos_proj.bias"] = rand(2 * DIM, DIM), rand(2 * DIM)
    else:
        for name in ("pos_q_linear", "pos_k_linear"):
            sd[S + name + ".weight"], sd[S + name + ".bias"] = rand(DIM, DIM), rand(DIM)
    if relative:
        sd[S + "relative_attention_bias.weight"] = rand(BUCKETS + 1, HEADS, std=1.0)
    if relative and with_bucket_matrix:
        sd[S + "rp_bucket"] = release_bucket_matrix(MAX_POSITIONS)
    for n in range(LAYERS):
        layer = f"{S}layers.{n}."
        sd[layer + "self_attn.in_proj_weight"] = rand(3 * DIM, DIM)
        sd[layer + "self_attn.in_proj_bias"] = rand(3 * DIM)
        sd[layer + "self_attn.out_proj.weight"] = rand(DIM, DIM)
        sd[layer + "self_attn.out_proj.bias"] = rand(DIM)
        norm(layer + "self_attn_layer_norm")
        sd[layer + "fc1.weight"], sd[layer + "fc1.bias"] = rand(FFN, DIM), rand(FFN)
        sd[layer + "fc2.weight"], sd[layer + "fc2.bias"] = rand(DIM, FFN), rand(DIM)
        norm(layer + "final_layer_norm")
    if not post_ln:
        norm(S + "emb_out_layer_norm")
    sd["decoder.lm_head.dense.weight"], sd["decoder.lm_head.dense.bias"] = rand(DIM, DIM), rand(DIM)
    norm("decoder.lm_head.layer_norm")
    sd["decoder.lm_head.weight"] = sd[S + "embed_tokens.weight"]
    sd["decoder.lm_head.bias"] = rand(vocab)
    return sd


def release_args(post_ln=True, embedding_ln=True, relative=True):
    """fairseq 0.8's saved argparse Namespace, with the authors' data path."""
    return argparse.Namespace(
        arch="bert_base", task="masked_lm", criterion="masked_lm", data=BOGUS_DATA, rel_pos=relative,
        embedding_normalize=embedding_ln, encoder_normalize_before=not post_ln, encoder_layers=LAYERS,
        encoder_embed_dim=DIM, encoder_ffn_embed_dim=FFN, encoder_attention_heads=HEADS,
        max_positions=MAX_POSITIONS, tokens_per_sample=MAX_POSITIONS, activation_fn="gelu",
        dropout=0.1, attention_dropout=0.1, activation_dropout=0.0, pooler_dropout=0.1,
        optimizer="lamb", lr=[0.0001], fp16=True,
    )


def save_release(path, sd, args=None):
    torch.save({
        "args": args if args is not None else release_args(),
        "model": sd,
        "optimizer_history": [{"criterion_name": "MaskedLmLoss", "optimizer_name": "FairseqLAMB",
                               "lr_scheduler_state": {"best": 2.31}, "num_updates": 1000000}],
        "extra_state": {"train_iterator": {"epoch": 40, "iterations_in_epoch": 123}, "val_loss": 2.31,
                        "best": 2.31},
        "last_optimizer_state": {"state": {0: {"exp_avg": torch.zeros(3)}}, "param_groups": []},
    }, path)
    return path


@pytest.fixture
def release_dir(tmp_path):
    """(directory for the release's files holding its dict.txt, embedding rows).

    As the release saves it: its Dictionary has 7 special symbols (<s> <pad> </s> <unk> <file> <email>
    <url>), dict.txt lists only the 40 words after them, and <mask> is the last row.
    """
    root = tmp_path / "release"
    root.mkdir()
    (root / "dict.txt").write_text("".join(f"w{i} {100 - i}\n" for i in range(40)))
    return root, 7 + 40 + 1


def convert_release(release, tmp_path, fp16=False, **variant):
    """Save a release-format checkpoint (fp16 tensors, as mixed-precision training saves them, if
    ``fp16``), convert it; return (its tensors in fp32, the output directory)."""
    root, vocab = release
    sd = release_state_dict(vocab, **variant)
    if fp16:
        sd = {k: v.half() if v.is_floating_point() else v for k, v in sd.items()}
    in_args = {name: variant[name] for name in ("post_ln", "embedding_ln", "relative") if name in variant}
    save_release(root / "model.pt", sd, release_args(**in_args))
    out = tmp_path / "converted"
    convert(str(root / "model.pt"), str(root / "dict.txt"), str(out))
    return {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}, out


def load_converted(out):
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(out / "model.pt")], arg_overrides={"data": str(out)}
    )
    return models[0].eval(), cfg, task


# ---------------------------------------------------------------- bucketing

def test_plugin_buckets_equal_the_release_buckets_for_offsets_up_to_600():
    offsets = torch.arange(-600, 601)
    assert relative_position_bucket(offsets).tolist() == [exact_t5_bucket(r) for r in offsets.tolist()]


def test_release_mode_bucket_matrix_resets_cls_row_and_column_to_extra_buckets(release_dir, tmp_path):
    _, out = convert_release(release_dir, tmp_path)
    model, _, _ = load_converted(out)
    relative = model.encoder.sentence_encoder.positional_term.relative_bias
    assert relative.relative_attention_bias.weight.shape == (BUCKETS + 1, HEADS)
    assert torch.equal(relative.buckets(MAX_POSITIONS), release_bucket_matrix(MAX_POSITIONS))


# ---------------------------------------------------------------- the converted model = the release

VARIANTS = {
    "as_released": {},
    "no_embedding_ln_fused_pos_proj": dict(embedding_ln=False, fused_proj=True, with_bucket_matrix=False),
    "pre_ln": dict(post_ln=False),
    "fp16_tensors": dict(fp16=True),
    "tupe_a": dict(relative=False),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_converted_model_matches_the_release_forward_with_padding(variant, release_dir, tmp_path):
    sd, out = convert_release(release_dir, tmp_path, **VARIANTS[variant])
    if S + "pos_proj.weight" in sd:
        q_w, k_w = sd.pop(S + "pos_proj.weight").chunk(2)
        q_b, k_b = sd.pop(S + "pos_proj.bias").chunk(2)
        sd.update({S + "pos_q_linear.weight": q_w, S + "pos_k_linear.weight": k_w,
                   S + "pos_q_linear.bias": q_b, S + "pos_k_linear.bias": k_b})
    model, _, task = load_converted(out)
    dictionary = task.source_dictionary
    tokens = random_tokens(dictionary, [MAX_POSITIONS, 17, 5, 1])
    with torch.no_grad():
        logits, extra = model(tokens, return_all_hiddens=True)
    hidden, expected_logits = release_forward(sd, tokens, dictionary.pad(), HEADS,
                                              post_ln=VARIANTS[variant].get("post_ln", True))
    assert len(extra["inner_states"]) == len(hidden) == LAYERS + 1
    for ours, theirs in zip(extra["inner_states"], hidden):
        torch.testing.assert_close(ours.transpose(0, 1), theirs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, expected_logits, atol=1e-5, rtol=1e-5)


def test_converted_model_gradients_match_the_release_forward(release_dir, tmp_path):
    sd, out = convert_release(release_dir, tmp_path)
    model, _, task = load_converted(out)
    tokens = random_tokens(task.source_dictionary, [MAX_POSITIONS, 9])
    weights = torch.randn(*tokens.shape, len(task.source_dictionary))
    (model(tokens)[0] * weights).sum().backward()
    leaves = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in sd.items()}
    leaves["decoder.lm_head.weight"] = leaves[S + "embed_tokens.weight"]
    (release_forward(leaves, tokens, task.source_dictionary.pad(), HEADS)[1] * weights).sum().backward()
    for name, param in model.named_parameters():
        key = S + "embed_tokens.weight" if name == "encoder.lm_head.weight" else release_key(name)
        torch.testing.assert_close(param.grad, leaves[key].grad, atol=1e-4, rtol=1e-4, msg=name)


def test_converted_checkpoint_records_the_release_options_not_the_authors_data_path(release_dir, tmp_path):
    _, out = convert_release(release_dir, tmp_path)
    state = torch.load(out / "model.pt", weights_only=True)
    model_cfg, task_cfg = state["cfg"]["model"], state["cfg"]["task"]
    assert model_cfg.arch == "tupe_r_base" and model_cfg.cls_reset == "release" and model_cfg.untied_proj_bias
    sizes = (model_cfg.encoder_layers, model_cfg.encoder_embed_dim, model_cfg.encoder_attention_heads,
             model_cfg.encoder_ffn_embed_dim, model_cfg.max_positions)
    assert sizes == (LAYERS, DIM, HEADS, FFN, MAX_POSITIONS)
    assert task_cfg["data"] == str(out) and BOGUS_DATA not in repr(state["cfg"])
    assert (out / "dict.txt").read_text() == \
        "<file> 0\n<email> 0\n<url> 0\n" + (release_dir[0] / "dict.txt").read_text()


def test_hub_from_pretrained_loads_the_converted_directory(release_dir, tmp_path):
    sd, out = convert_release(release_dir, tmp_path)
    hub = TupeRobertaModel.from_pretrained(str(out), bpe=None).eval()
    tokens = hub.task.source_dictionary.encode_line("<s> w3 w17 w5 w39", add_if_not_exist=False).long()
    assert tokens[0] == hub.task.source_dictionary.bos() and hub.task.source_dictionary.unk() not in tokens
    hidden, _ = release_forward(sd, tokens[None], hub.task.source_dictionary.pad(), HEADS)
    with torch.no_grad():
        torch.testing.assert_close(hub.extract_features(tokens), hidden[-1], atol=1e-5, rtol=1e-5)


def test_loading_it_without_the_release_flags_names_them(release_dir, tmp_path):
    _, out = convert_release(release_dir, tmp_path)
    with pytest.raises(ValueError, match="--cls-reset release --untied-proj-bias"):
        checkpoint_utils.load_model_ensemble_and_task(
            [str(out / "model.pt")], arg_overrides={"data": str(out), "cls_reset": "paper"}
        )
    with pytest.raises(ValueError, match="bias .*: build the model with --untied-proj-bias"):
        checkpoint_utils.load_model_ensemble_and_task(
            [str(out / "model.pt")], arg_overrides={"data": str(out), "untied_proj_bias": False}
        )


def _shapes_only(vocab, layers, dim, heads, ffn, positions):
    meta = dict(device="meta")
    sd = {S + "embed_tokens.weight": torch.empty(vocab, dim, **meta),
          S + "pos.weight": torch.empty(positions + 1, dim, **meta),
          S + "relative_attention_bias.weight": torch.empty(BUCKETS + 1, heads, **meta),
          S + "emb_layer_norm.weight": torch.empty(dim, **meta)}
    for n in range(layers):
        sd[f"{S}layers.{n}.fc1.weight"] = torch.empty(ffn, dim, **meta)
    return sd


@pytest.mark.parametrize("size, shape", [("base", (12, 768, 12, 3072)), ("large", (24, 1024, 16, 4096))])
def test_sizes_and_architecture_are_read_from_the_tensors(size, shape):
    layers, dim, heads, ffn = shape
    opts = official_tupe.release_options(_shapes_only(32773, layers, dim, heads, ffn, 512), None)
    line = official_tupe.plugin_command_line(opts, "DATA")
    assert line[line.index("--arch") + 1] == f"tupe_r_{size}"
    for flag, value in [("--encoder-layers", layers), ("--encoder-embed-dim", dim),
                        ("--encoder-attention-heads", heads), ("--encoder-ffn-embed-dim", ffn),
                        ("--max-positions", 512), ("--rel-pos-buckets", BUCKETS), ("--cls-reset", "release")]:
        assert line[line.index(flag) + 1] == str(value)
    assert "--untied-proj-bias" in line and "--no-layernorm-embedding" not in line


# ---------------------------------------------------------------- plugin options

def test_release_reset_without_untied_term_is_refused():
    with pytest.raises(PositionFlagError, match="--cls-reset release needs --untied-pos tupe"):
        build_model("bert_r_tiny", cls_reset="release")
    with pytest.raises(PositionFlagError, match="--untied-proj-bias .* --untied-pos none"):
        build_model("bert_r_tiny", untied_proj_bias=True)


def test_release_mode_table_has_an_extra_row_and_refuses_longer_inputs(dictionary):
    model = build_model("tupe_r_tiny", dictionary, max_positions=16, cls_reset="release",
                        untied_proj_bias=True)
    untied = model.encoder.sentence_encoder.positional_term.untied_position
    assert untied.embed_positions.weight.shape[0] == 17 and untied.q_proj.bias is not None
    model(random_tokens(dictionary, [16]))
    with pytest.raises(ValueError, match="--max-positions"):
        model(random_tokens(dictionary, [17]))


# ---------------------------------------------------------------- errors name the keys

def _expect_error(release, tmp_path, sd, match):
    root, _ = release
    save_release(root / "model.pt", sd)
    with pytest.raises(ReleaseCheckpointError, match=match):
        convert(str(root / "model.pt"), str(root / "dict.txt"), str(tmp_path / "converted"))


def test_missing_key_is_named(release_dir, tmp_path):
    sd = release_state_dict(release_dir[1])
    del sd[S + "layers.1.fc2.bias"], sd[S + "pos_ln.weight"]
    _expect_error(release_dir, tmp_path, sd,
                  rf"missing keys .*: {S}layers\.1\.fc2\.bias, {S}pos_ln\.weight")


def test_unexpected_key_is_named(release_dir, tmp_path):
    sd = release_state_dict(release_dir[1])
    sd[S + "segment_embeddings.weight"] = torch.zeros(2, DIM)
    sd["decoder.pooler.weight"] = torch.zeros(DIM, DIM)
    _expect_error(release_dir, tmp_path, sd,
                  rf"unexpected keys .*: decoder\.pooler\.weight, {S}segment_embeddings\.weight")


def test_wrong_shape_is_named_with_both_shapes(release_dir, tmp_path):
    sd = release_state_dict(release_dir[1])
    sd[S + "layers.0.fc2.weight"] = torch.zeros(DIM, FFN + 1)
    _expect_error(release_dir, tmp_path, sd, rf"wrong shapes: {S}layers\.0\.fc2\.weight: "
                  rf"\({DIM}, {FFN + 1}\), expected \({DIM}, {FFN}\)")


@pytest.mark.parametrize("rows", [7 + 40 + 1 + 1, 7 + 40, 4 + 40, 4 + 40 + 2])
def test_dictionary_of_another_size_is_refused(release_dir, tmp_path, rows):
    sd = release_state_dict(rows)
    _expect_error(release_dir, tmp_path, sd,
                  rf"--dict .* lists 40 symbols, but .*embed_tokens\.weight has {rows} "
                  r"rows; the release's dict.txt gives 48 rows .* a fairseq 0.12 one 45: pass the dict.txt")


def test_stored_bucket_matrix_that_differs_is_refused(release_dir, tmp_path):
    sd = release_state_dict(release_dir[1])
    sd[S + "rp_bucket"][3, 9] = 0
    _expect_error(release_dir, tmp_path, sd, r"rp_bucket differs .* first \(query 3, key 9\)")


def test_untied_output_embedding_is_refused(release_dir, tmp_path):
    sd = release_state_dict(release_dir[1])
    sd["decoder.lm_head.weight"] = sd["decoder.lm_head.weight"] + 1
    _expect_error(release_dir, tmp_path, sd, "decoder.lm_head.weight differs")


@pytest.mark.parametrize("remove, saved, held", [
    ("emb_layer_norm", "args.embedding_normalize = True", "lacks emb_layer_norm.weight"),
    ("layers.1", f"args.encoder_layers = {LAYERS}", "holds 1 encoder layers"),
    ("relative_attention_bias", "args.rel_pos = True", "lacks relative_attention_bias.weight"),
])
def test_tensors_that_contradict_the_saved_args_are_refused_naming_both(release_dir, tmp_path, remove, saved,
                                                                        held):
    sd = release_state_dict(release_dir[1])
    sd = {key: value for key, value in sd.items() if not key.startswith(S + remove)}
    _expect_error(release_dir, tmp_path, sd, rf"{re.escape(saved)} but the checkpoint {held}")


def test_pickled_objects_need_allow_pickle(release_dir, tmp_path):
    root, vocab = release_dir
    save_release(root / "model.pt", release_state_dict(vocab), args=types.SimpleNamespace(arch="bert"))
    with pytest.raises(UnsafeCheckpointError, match=r"^--checkpoint .*model.pt holds objects a checkpoint "
                       r"does not hold \(types.SimpleNamespace\); it was not loaded: .*--allow-pickle$"):
        convert(str(root / "model.pt"), str(root / "dict.txt"), str(tmp_path / "converted"))


def _truncated(path, legacy):
    state = torch.load(path, weights_only=False)
    torch.save(state, path, _use_new_zipfile_serialization=not legacy)
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])


def _damaged_legacy(path):
    """A complete file in torch.save's former format whose first pickle (torch's magic number) is damaged."""
    state = torch.load(path, weights_only=False)
    torch.save(state, path, _use_new_zipfile_serialization=False)
    data = bytearray(path.read_bytes())
    data[4] ^= 0xFF  # a byte of the magic number, inside the first pickle
    path.write_bytes(bytes(data))


DAMAGES = {
    "truncated": "it is truncated: a zip archive that ends before its directory",
    "truncated legacy format": "it is truncated: it ends before the data it announces",
    "damaged legacy format": "its pickled data is damaged or not a checkpoint's",
    "text file": "it is not a file written by torch.save",
    "empty file": "it is empty",
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_file_that_is_not_a_complete_pytorch_checkpoint_is_named(release_checkpoint, tmp_path, damage):
    path = release_checkpoint / "model.pt"
    if damage.startswith("truncated"):
        _truncated(path, legacy=damage.endswith("legacy format"))
    elif damage.startswith("damaged"):
        _damaged_legacy(path)
    else:
        path.write_text("" if damage == "empty file" else "w0 100\nw1 99\n")
    with pytest.raises(SystemExit) as error:
        convert_official_tupe.main(["--checkpoint", str(path), "--dict", str(release_checkpoint / "dict.txt"),
                                    "--out", str(tmp_path / "converted")])
    assert str(error.value) == (
        f"tupe-convert-official: error: --checkpoint {path} ({path.stat().st_size} bytes) cannot be read as "
        f"a PyTorch checkpoint: {DAMAGES[damage]}; pass the release's model.pt (extract tupe_ckp.tar.gz "
        "again)")


class RunsShell:
    """Unpickled, it runs ``os.system`` (a module torch's weights-only loader blocks)."""

    def __reduce__(self):
        return os.system, ("true",)


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_a_complete_crafted_checkpoint_is_refused_as_holding_objects_not_as_truncated(release_dir, tmp_path,
                                                                                      legacy):
    root, vocab = release_dir
    path = save_release(root / "model.pt", release_state_dict(vocab))
    state = torch.load(path, weights_only=False)
    state["extra_state"]["note"] = RunsShell()
    torch.save(state, path, _use_new_zipfile_serialization=not legacy)
    with pytest.raises(SystemExit) as error:
        convert_official_tupe.main(["--checkpoint", str(path), "--dict", str(root / "dict.txt"),
                                    "--out", str(tmp_path / "converted")])
    assert str(error.value) == (
        f"tupe-convert-official: error: --checkpoint {path} holds objects a checkpoint does not hold "
        f"({os.system.__module__}.system); it was not loaded: if you trust the file, rerun with "
        "--allow-pickle")


def test_command_line_reports_errors_without_a_traceback(release_dir, tmp_path):
    root, _ = release_dir
    sd = release_state_dict(release_dir[1])
    del sd[S + "pos.weight"]
    save_release(root / "model.pt", sd)
    with pytest.raises(SystemExit, match=rf"missing key {S}pos\.weight"):
        convert_official_tupe.main(["--checkpoint", str(root / "model.pt"), "--dict", str(root / "dict.txt"),
                                    "--out", str(tmp_path / "converted")])


# ---------------------------------------------------------------- fairseq command-line tools

@pytest.fixture
def converted_for_wikitext(wikitext_bin, tmp_path):
    """A release-format checkpoint over the corpus's own dictionary (+ <mask>), converted."""
    vocab = len(Dictionary.load(str(wikitext_bin / "dict.txt"))) + 1
    root = tmp_path / "release"
    root.mkdir()
    save_release(root / "model.pt", release_state_dict(vocab))
    out = tmp_path / "converted"
    convert(str(root / "model.pt"), str(wikitext_bin / "dict.txt"), str(out))
    return out


def test_fairseq_validate_runs_on_the_converted_checkpoint(wikitext_bin, converted_for_wikitext):
    validated = run_fairseq(
        "validate", wikitext_bin, "--user-dir", "tupe_plugin", "--path", converted_for_wikitext / "model.pt",
        "--task", "masked_lm", "--tokens-per-sample", MAX_POSITIONS, "--batch-size", 8, "--cpu",
    )
    (loss,) = logged_losses(validated, "valid")
    assert math.isfinite(loss)


@pytest.mark.slow
def test_sentence_prediction_fine_tunes_from_the_converted_checkpoint(wikitext_bin, converted_for_wikitext,
                                                                      tmp_path):
    glue = tmp_path / "glue-bin"
    lines = [line for line in (wikitext_bin.parent / "valid.txt").read_text().splitlines() if line.strip()]
    (tmp_path / "train.input0").write_text("\n".join(lines[:32]) + "\n")
    (tmp_path / "train.label").write_text("\n".join(str(i % 2) for i in range(32)) + "\n")
    run_fairseq("preprocess", "--only-source", "--trainpref", tmp_path / "train.input0",
                "--validpref", tmp_path / "train.input0", "--srcdict", wikitext_bin / "dict.txt",
                "--destdir", glue / "input0", "--workers", 1)
    run_fairseq("preprocess", "--only-source", "--trainpref", tmp_path / "train.label",
                "--validpref", tmp_path / "train.label", "--destdir", glue / "label", "--workers", 1)
    out = run_fairseq(
        "train", glue, "--user-dir", "tupe_plugin", "--task", "sentence_prediction",
        "--criterion", "sentence_prediction", "--arch", "tupe_r_base",
        "--restore-file", converted_for_wikitext / "model.pt", "--reset-optimizer", "--reset-dataloader",
        "--reset-meters", "--init-token", 0, "--separator-token", 2, "--num-classes", 2,
        "--max-positions", MAX_POSITIONS, "--shorten-method", "truncate",
        "--cls-reset", "release", "--untied-proj-bias",
        "--encoder-layers", LAYERS, "--encoder-embed-dim", DIM, "--encoder-attention-heads", HEADS,
        "--encoder-ffn-embed-dim", FFN, "--batch-size", 8, "--max-update", 2, "--optimizer", "adam",
        "--lr", 1e-4, "--save-dir", tmp_path / "ft", "--cpu", "--log-format", "simple", "--log-interval", 1,
        "--num-workers", 0, "--no-epoch-checkpoints", "--no-save",
    )
    assert "Loaded checkpoint" in out
    losses = train_inner_losses(out)
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)


# ---------------------------------------------------------------- the release's dictionary, heads, meters

def test_release_dictionary_of_seven_specials_keeps_every_word_id(release_dir, tmp_path):
    sd, out = convert_release(release_dir, tmp_path)
    dictionary = Dictionary.load(str(out / "dict.txt"))
    dictionary.add_symbol("<mask>")
    assert len(dictionary) == release_dir[1]
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<file>", "<email>", "<url>"]
    assert [dictionary[i] for i in range(7)] == specials
    model, _, _ = load_converted(out)
    embeddings = model.encoder.sentence_encoder.embed_tokens.weight
    for word, release_row in (("w0", 7), ("w5", 12), ("w39", 46)):
        assert dictionary.index(word) == release_row
        assert torch.equal(embeddings[dictionary.index(word)], sd[S + "embed_tokens.weight"][release_row])


def test_converted_dictionary_passed_again_gives_the_same_ids(release_dir, tmp_path):
    root, vocab = release_dir
    save_release(root / "model.pt", release_state_dict(vocab))
    convert(str(root / "model.pt"), str(root / "dict.txt"), str(tmp_path / "first"))
    convert(str(root / "model.pt"), str(tmp_path / "first" / "dict.txt"), str(tmp_path / "second"))
    assert (tmp_path / "second" / "dict.txt").read_text() == (tmp_path / "first" / "dict.txt").read_text()


def release_head(sd, name, classes=3, prefix="classification_heads."):
    g = torch.Generator().manual_seed(7)
    sd[f"{prefix}{name}.dense.weight"] = torch.randn(DIM, DIM, generator=g) * 0.3
    sd[f"{prefix}{name}.dense.bias"] = torch.randn(DIM, generator=g) * 0.3
    sd[f"{prefix}{name}.out_proj.weight"] = torch.randn(classes, DIM, generator=g) * 0.3
    sd[f"{prefix}{name}.out_proj.bias"] = torch.randn(classes, generator=g) * 0.3
    return sd


@pytest.mark.parametrize("prefix", ["classification_heads.", "decoder.classification_heads."])
def test_fine_tuned_release_head_gives_the_release_head_outputs(release_dir, tmp_path, prefix):
    # The release's head: dense -> tanh -> dropout -> out_proj on <s>, no dropout before dense; in eval
    # mode RoBERTa's head (dropout -> dense -> tanh -> dropout -> out_proj) computes the same.
    root, vocab = release_dir
    sd = release_head(release_state_dict(vocab), "rte", prefix=prefix)
    save_release(root / "model.pt", sd)
    convert(str(root / "model.pt"), str(root / "dict.txt"), str(tmp_path / "converted"))
    hub = TupeRobertaModel.from_pretrained(str(tmp_path / "converted"), bpe=None)
    model, dictionary = hub.model, hub.task.source_dictionary
    tokens = random_tokens(dictionary, [MAX_POSITIONS, 11])
    hidden, _ = release_forward(sd, tokens, dictionary.pad(), HEADS)
    first = hidden[-1][:, 0]
    expected = torch.tanh(first @ sd[prefix + "rte.dense.weight"].t() + sd[prefix + "rte.dense.bias"]) \
        @ sd[prefix + "rte.out_proj.weight"].t() + sd[prefix + "rte.out_proj.bias"]
    with torch.no_grad():
        logits, _ = model(tokens, features_only=True, classification_head_name="rte")
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


class _Meter:
    """Stands for the fork's fairseq.meters classes when saving a fixture."""

    def __init__(self, **state):
        self.__dict__.update(state)


@pytest.fixture
def fork_meters(monkeypatch):
    """The fork's fairseq.meters module, present only while the fixture checkpoint is saved."""
    module = types.ModuleType("fairseq.meters")
    classes = {}
    for name in ("AverageMeter", "TimeMeter", "StopwatchMeter"):
        classes[name] = type(name, (_Meter,), {"__module__": "fairseq.meters"})
        setattr(module, name, classes[name])
    monkeypatch.setitem(sys.modules, "fairseq.meters", module)
    return classes


@pytest.mark.parametrize("meters", [
    ["AverageMeter"], ["TimeMeter", "StopwatchMeter"], ["AverageMeter", "TimeMeter", "StopwatchMeter"],
])
def test_training_meters_of_the_fork_are_dropped_without_allow_pickle(release_dir, tmp_path, fork_meters,
                                                                      monkeypatch, caplog, meters):
    from collections import OrderedDict

    root, vocab = release_dir
    path = save_release(root / "model.pt", release_state_dict(vocab))
    state = torch.load(path, weights_only=False)
    state["extra_state"]["train_meters"] = OrderedDict(
        (f"m{i}", fork_meters[name](val=1.5, sum=3.0, count=2, avg=1.5, start=12.0))
        for i, name in enumerate(meters))
    torch.save(state, path)
    monkeypatch.delitem(sys.modules, "fairseq.meters")  # modern fairseq has no such module
    with caplog.at_level("INFO", logger="convert_official_tupe"):
        convert(str(path), str(root / "dict.txt"), str(tmp_path / "converted"))
    saved = torch.load(tmp_path / "converted" / "model.pt", weights_only=True)
    assert "train_meters" not in saved["extra_state"]
    assert f"dropped extra_state['train_meters'] ({len(meters)} training meters" in caplog.text


# ---------------------------------------------------------------- --out is never overwritten without --force

def converted_files(out):
    return {p.name: p.read_bytes() for p in out.iterdir()}


@pytest.fixture
def release_checkpoint(release_dir):
    root, vocab = release_dir
    save_release(root / "model.pt", release_state_dict(vocab))
    return root


def test_command_line_ends_with_the_checkpoint_and_the_output_folder(release_checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    assert convert_official_tupe.main(["--checkpoint", str(release_checkpoint / "model.pt"),
                                       "--dict", str(release_checkpoint / "dict.txt"),
                                       "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-3:] == [
        "tupe-convert-official: done", f"checkpoint:    {out / 'model.pt'}",
        f"output folder: {out} (model.pt, dict.txt)"]


@pytest.mark.parametrize("existing", [["dict.txt"], ["model.pt"], ["model.pt", "dict.txt"]])
def test_existing_outputs_stop_the_conversion_untouched(release_checkpoint, tmp_path, existing, capsys):
    out = tmp_path / "out"
    out.mkdir()
    for name in existing:
        (out / name).write_text("the user's " + name)
    with pytest.raises(SystemExit) as error:
        convert_official_tupe.main(["--checkpoint", str(release_checkpoint / "model.pt"),
                                    "--dict", str(release_checkpoint / "dict.txt"), "--out", str(out)])
    assert str(error.value).startswith(f"tupe-convert-official: error: --out {out} already holds "
                                       f"{' and '.join(existing)}; nothing is overwritten")
    assert "--force" in str(error.value)
    assert converted_files(out) == {name: f"the user's {name}".encode() for name in existing}


@pytest.mark.parametrize("force", [False, True])
def test_conversion_failing_midway_leaves_the_folder_as_it_was(release_checkpoint, tmp_path, monkeypatch,
                                                              force):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    if force:
        (out / "dict.txt").write_text("the user's dict")

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")
    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        convert(str(release_checkpoint / "model.pt"), str(release_checkpoint / "dict.txt"), str(out),
                force=force)
    expected = {"notes.txt": b"mine", **({"dict.txt": b"the user's dict"} if force else {})}
    assert converted_files(out) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "release"]  # no half-written folder left


def test_conversion_failing_midway_creates_no_output_folder(release_dir, tmp_path):
    root, vocab = release_dir
    sd = release_state_dict(vocab)
    del sd[S + "layers.1.fc2.bias"]
    save_release(root / "model.pt", sd)
    with pytest.raises(ReleaseCheckpointError, match="missing keys"):
        convert(str(root / "model.pt"), str(root / "dict.txt"), str(tmp_path / "out"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["release"]


def test_force_replaces_model_and_dict_after_success_and_keeps_other_files(release_checkpoint, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("model.pt", "dict.txt", "notes.txt"):
        (out / name).write_text("old " + name)
    convert_official_tupe.main(["--checkpoint", str(release_checkpoint / "model.pt"),
                                "--dict", str(release_checkpoint / "dict.txt"), "--out", str(out), "--force"])
    files = converted_files(out)
    assert files["notes.txt"] == b"old notes.txt"
    assert files["dict.txt"].startswith(b"<file> 0\n") and "model" in torch.load(out / "model.pt",
                                                                                    weights_only=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "release"]


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("inputs", [["model.pt", "dict.txt"], ["dict.txt"], ["model.pt"]])
def test_out_holding_the_input_files_is_refused_even_with_force(release_checkpoint, tmp_path, inputs, force):
    out = tmp_path / "out"
    out.mkdir()
    for name in inputs:
        (out / name).write_bytes((release_checkpoint / name).read_bytes())
    paths = {name: (out if name in inputs else release_checkpoint) / name
             for name in ("model.pt", "dict.txt")}
    before = converted_files(out)
    with pytest.raises(SystemExit) as error:
        convert_official_tupe.main(["--checkpoint", str(paths["model.pt"]), "--dict", str(paths["dict.txt"]),
                                    "--out", str(out)] + (["--force"] if force else []))
    flags = {"model.pt": "--checkpoint", "dict.txt": "--dict"}
    named = " and ".join(f"{flags[name]} {out / name}" for name in inputs)
    assert str(error.value) == (
        f"tupe-convert-official: error: --out {out} holds the input {named}, which the converted files "
        "would replace (--force or not): give another --out")
    assert converted_files(out) == before


def test_out_that_links_to_the_release_folder_is_refused(release_checkpoint, tmp_path):
    out = tmp_path / "link"
    out.symlink_to(release_checkpoint, target_is_directory=True)
    with pytest.raises(ReleaseCheckpointError, match=rf"--out {out} holds the input --checkpoint "
                                                     rf"{release_checkpoint / 'model.pt'} and --dict"):
        convert(str(release_checkpoint / "model.pt"), str(release_checkpoint / "dict.txt"), str(out),
                force=True)
