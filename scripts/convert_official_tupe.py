#!/usr/bin/env python3
"""Convert the TUPE authors' released TUPE-R checkpoint into a plugin checkpoint.

The release (``tupe_ckp.tar.gz``: ``model.pt`` + ``dict.txt``) was saved by their fairseq 0.8 fork
(model ``bert``); its format and the ways its computation departs from the paper are described in
docs/official_tupe.md. This script::

    python scripts/convert_official_tupe.py --checkpoint tupe_ckp/model.pt --dict tupe_ckp/dict.txt \\
        --out tupe_r_release

writes ``OUT/model.pt``, a fairseq checkpoint of the plugin's ``tupe_r_*`` architecture with the
release's semantics (``--cls-reset release --untied-proj-bias``, ``--max-positions`` = table rows - 1,
the embedding LayerNorm when the release has one), and ``OUT/dict.txt``. fairseq-validate,
``TupeRobertaModel.from_pretrained(OUT)`` and sentence_prediction fine-tuning (``--restore-file``)
load it like any plugin checkpoint.

* The release's ``args.data`` (the authors' machine) is never read: the configuration is built anew
  from the tensors' shapes (layers, sizes, heads, positions, buckets) and the release's
  non-shape settings (activation, dropouts).
* The file is read with ``torch.load(weights_only=True)``: only tensors, plain containers and the
  argparse ``Namespace`` fairseq stores (allowed by ``tupe_plugin.checkpoint_compat``) are
  unpickled, so a tampered file cannot run code. ``--allow-pickle`` lifts that for a file you trust.
* Every tensor is mapped; a key the plugin has no place for, a key the plugin needs but the file
  lacks, or a shape that does not fit stops the conversion with the keys named.
* fairseq 0.8 BERT's pooler (dense + tanh on ``<s>``) lives in its classification heads: fine-tuned
  checkpoints' ``decoder.classification_heads.NAME`` become RoBERTa classification heads of the same
  computation; the pre-trained release has none. Its LM head (dense, activation, LayerNorm, output
  weights tied to the word embeddings, bias) is RoBERTa's LM head.
"""

import argparse
import logging
import os
import pickle
import re
import shutil
import sys

import torch
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from omegaconf import OmegaConf

import tupe_plugin  # noqa: F401  (registers the model, and the Namespace for weights_only loading)

logger = logging.getLogger("convert_official_tupe")

RELEASE = "decoder.sentence_encoder."
PLUGIN = "encoder.sentence_encoder."
UNTIED = PLUGIN + "positional_term.untied_position."
# plugin key prefix -> release key prefix, most specific first
PREFIXES = (
    (UNTIED + "embed_positions.", RELEASE + "pos."),
    (UNTIED + "layer_norm.", RELEASE + "pos_ln."),
    (UNTIED + "q_proj.", RELEASE + "pos_q_linear."),
    (UNTIED + "k_proj.", RELEASE + "pos_k_linear."),
    (PLUGIN + "positional_term.relative_bias.", RELEASE),
    (PLUGIN + "layernorm_embedding.", RELEASE + "emb_layer_norm."),
    (PLUGIN + "layer_norm.", RELEASE + "emb_out_layer_norm."),
    (PLUGIN, RELEASE),
    ("encoder.lm_head.", "decoder.lm_head."),
    ("classification_heads.", "decoder.classification_heads."),
)
BUCKET_MATRIX = RELEASE + "rp_bucket"
FUSED_POSITION_PROJ = RELEASE + "pos_proj."
TIED_OUTPUT = "decoder.lm_head.weight"
RELEASE_MAX_DISTANCE = 128
SIZE_NAMES = {(2, 128, 4, 512): "tiny", (8, 512, 8, 2048): "medium", (12, 768, 12, 3072): "base",
              (24, 1024, 16, 4096): "large"}
# fairseq 0.8 bert_base defaults for what the release's args may lack
RELEASE_DEFAULTS = dict(activation_fn="gelu", dropout=0.1, attention_dropout=0.1,
                        activation_dropout=0.0, pooler_dropout=0.1, pooler_activation_fn="tanh")
CHECKPOINT_NAME = "model.pt"


class ReleaseCheckpointError(ValueError):
    """The file is not a TUPE release checkpoint the plugin can represent exactly."""


def release_key(plugin_key):
    """The release's state-dict key holding the tensor of ``plugin_key``."""
    plugin_key = re.sub(r"\.self_attn\.in_proj\.(weight|bias)$", r".self_attn.in_proj_\1", plugin_key)
    for plugin_prefix, release_prefix in PREFIXES:
        if plugin_key.startswith(plugin_prefix):
            return release_prefix + plugin_key[len(plugin_prefix):]
    raise KeyError(plugin_key)


def load_release(path, allow_pickle=False):
    """(state dict with float32 tensors, args Namespace or None) of a fairseq 0.8 checkpoint."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=not allow_pickle)
    except pickle.UnpicklingError as error:
        raise ReleaseCheckpointError(
            f"{path} holds objects besides tensors and fairseq's argparse Namespace, which "
            f"torch.load(weights_only=True) refuses ({str(error).splitlines()[0]}); if you trust "
            "the file, rerun with --allow-pickle"
        ) from error
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise ReleaseCheckpointError(
            f"{path} is not a fairseq checkpoint: expected a dict with a 'model' state dict"
        )
    model = {k: v.float() if v.is_floating_point() else v for k, v in state["model"].items()}
    return _split_fused_position_proj(model), state.get("args")


def _split_fused_position_proj(model):
    """Some versions of the release's code keep U^Q and U^K as one Linear(d, 2d): q rows first."""
    if FUSED_POSITION_PROJ + "weight" not in model:
        return model
    for name in ("weight", "bias"):
        fused = model.pop(FUSED_POSITION_PROJ + name)
        model[RELEASE + "pos_q_linear." + name], model[RELEASE + "pos_k_linear." + name] = fused.chunk(2)
    return model


def _require(model, key, why):
    if key not in model:
        raise ReleaseCheckpointError(f"missing key {key} ({why}); is this a TUPE release checkpoint?")
    return model[key]


def release_options(model, args):
    """The plugin's model options reproducing the release, read from the tensors and ``args``."""
    vocab, embed_dim = _require(model, RELEASE + "embed_tokens.weight", "word embeddings").shape
    layers = {int(m.group(1)) for k in model for m in [re.match(re.escape(RELEASE) + r"layers\.(\d+)\.", k)]
              if m}
    if not layers:
        raise ReleaseCheckpointError(f"no {RELEASE}layers.N.* keys: the checkpoint has no encoder layers")
    ffn_dim = _require(model, RELEASE + "layers.0.fc1.weight", "feed-forward size").size(0)
    table_rows = _require(model, RELEASE + "pos.weight", "the untied position table").size(0)
    saved = {k: getattr(args, k) for k in vars(args)} if args is not None else {}
    relative = model.get(RELEASE + "relative_attention_bias.weight")
    heads = relative.size(1) if relative is not None else saved.get("encoder_attention_heads")
    if heads is None:
        raise ReleaseCheckpointError(
            "the checkpoint has neither relative_attention_bias.weight nor args.encoder_attention_heads: "
            "the number of heads is unknown"
        )
    if saved.get("encoder_attention_heads", heads) != heads:
        raise ReleaseCheckpointError(
            f"args.encoder_attention_heads = {saved['encoder_attention_heads']} but "
            f"relative_attention_bias.weight has {heads} columns (one per head)"
        )
    prenorm = RELEASE + "emb_out_layer_norm.weight" in model
    if saved.get("encoder_normalize_before", prenorm) != prenorm:
        raise ReleaseCheckpointError(
            f"args.encoder_normalize_before = {saved['encoder_normalize_before']} but the checkpoint "
            f"{'has' if prenorm else 'lacks'} the final emb_out_layer_norm of a pre-LN encoder"
        )
    opts = {k: saved.get(k, default) for k, default in RELEASE_DEFAULTS.items()}
    opts.update(
        vocab=vocab,
        encoder_layers=max(layers) + 1,
        encoder_embed_dim=embed_dim,
        encoder_ffn_embed_dim=ffn_dim,
        encoder_attention_heads=heads,
        max_positions=table_rows - 1,
        rel_pos="t5" if relative is not None else "none",
        rel_pos_buckets=relative.size(0) - 1 if relative is not None else 32,
        layernorm_embedding=RELEASE + "emb_layer_norm.weight" in model,
        encoder_normalize_before=prenorm,
    )
    return opts


def plugin_command_line(opts, data_dir):
    """The fairseq-train command line (after ``fairseq-train``) of the converted model."""
    size = SIZE_NAMES.get((opts["encoder_layers"], opts["encoder_embed_dim"],
                           opts["encoder_attention_heads"], opts["encoder_ffn_embed_dim"]), "base")
    arch = f"tupe_{'r' if opts['rel_pos'] == 't5' else 'a'}_{size}"
    line = [
        data_dir, "--user-dir", os.path.dirname(tupe_plugin.__file__),
        "--task", "masked_lm", "--criterion", "masked_lm", "--arch", arch,
        "--tokens-per-sample", opts["max_positions"], "--max-positions", opts["max_positions"],
        "--abs-pos", "none", "--untied-pos", "tupe", "--cls-reset", "release", "--untied-proj-bias",
        "--rel-pos", opts["rel_pos"], "--rel-pos-buckets", opts["rel_pos_buckets"],
        "--rel-pos-max-distance", RELEASE_MAX_DISTANCE,
    ]
    for name in ("encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_attention_heads",
                 "activation_fn", "dropout", "attention_dropout", "activation_dropout", "pooler_dropout",
                 "pooler_activation_fn"):
        line += ["--" + name.replace("_", "-"), opts[name]]
    if not opts["layernorm_embedding"]:
        line.append("--no-layernorm-embedding")
    if opts["encoder_normalize_before"]:
        line.append("--encoder-normalize-before")
    return [str(arg) for arg in line]


def register_release_heads(model, release):
    """RoBERTa classification heads for the release's (fine-tuned) ``classification_heads``."""
    prefix = "decoder.classification_heads."
    for key in release:
        if key.startswith(prefix) and key.endswith(".out_proj.weight"):
            name = key[len(prefix):-len(".out_proj.weight")]
            dense = release.get(f"{prefix}{name}.dense.weight")
            model.register_classification_head(
                name, num_classes=release[key].size(0),
                inner_dim=dense.size(0) if dense is not None else None,
            )


def map_state_dict(release, plugin_model):
    """The plugin state dict holding every release tensor; errors name missing/unexpected/misshapen keys."""
    release = dict(release)
    bucket_matrix = release.pop(BUCKET_MATRIX, None)
    tied_output = release.pop(TIED_OUTPUT, None)
    mapped, missing, misshapen, used = {}, [], [], set()
    for key, expected in plugin_model.state_dict().items():
        if key == "encoder.lm_head.weight":
            key_in_release = RELEASE + "embed_tokens.weight"
        else:
            key_in_release = release_key(key)
        if key_in_release not in release:
            missing.append(key_in_release)
            continue
        tensor = release[key_in_release]
        used.add(key_in_release)
        if tensor.shape != expected.shape:
            misshapen.append(f"{key_in_release}: {tuple(tensor.shape)}, expected {tuple(expected.shape)}")
            continue
        mapped[key] = tensor.to(expected.dtype)
    unexpected = sorted(set(release) - used)
    problems = []
    if missing:
        problems.append("missing keys (the plugin needs them): " + ", ".join(sorted(missing)))
    if unexpected:
        problems.append("unexpected keys (no place for them in the plugin's TUPE model): "
                        + ", ".join(unexpected))
    if misshapen:
        problems.append("wrong shapes: " + "; ".join(misshapen))
    if problems:
        raise ReleaseCheckpointError("the checkpoint does not fit the release's TUPE model:\n  "
                                     + "\n  ".join(problems))
    if tied_output is not None and not torch.equal(tied_output, mapped["encoder.lm_head.weight"]):
        raise ReleaseCheckpointError(
            f"{TIED_OUTPUT} differs from {RELEASE}embed_tokens.weight: the release ties them, and so "
            "does the plugin's LM head"
        )
    if bucket_matrix is not None:
        _check_bucket_matrix(bucket_matrix, plugin_model)
    return mapped


def _check_bucket_matrix(saved, plugin_model):
    """The release may store its (T, T) bucket matrix; it must equal the plugin's release buckets."""
    relative = plugin_model.encoder.sentence_encoder.positional_term.relative_bias
    if relative is None or saved.dim() != 2 or saved.size(0) != saved.size(1):
        raise ReleaseCheckpointError(f"unexpected {BUCKET_MATRIX} of shape {tuple(saved.shape)}")
    ours = relative.buckets(saved.size(0))
    if not torch.equal(saved.long(), ours):
        rows, cols = torch.nonzero(saved.long() != ours, as_tuple=True)
        raise ReleaseCheckpointError(
            f"{BUCKET_MATRIX} differs from the release bucketing reproduced by the plugin at "
            f"{rows.numel()} pairs, first (query {rows[0]}, key {cols[0]}): saved "
            f"{saved[rows[0], cols[0]]}, plugin {ours[rows[0], cols[0]]}"
        )
    logger.info("%s (the release's bucket matrix) equals the plugin's; not stored", BUCKET_MATRIX)


def convert(checkpoint, dict_path, out_dir, allow_pickle=False):
    """Write ``out_dir/model.pt`` and ``out_dir/dict.txt``; return the checkpoint path."""
    target = os.path.join(out_dir, CHECKPOINT_NAME)
    if os.path.exists(target):
        raise ReleaseCheckpointError(f"{target} exists; choose another --out (nothing is overwritten)")
    release, args = load_release(checkpoint, allow_pickle)
    opts = release_options(release, args)
    os.makedirs(out_dir, exist_ok=True)
    out_dict = os.path.join(out_dir, "dict.txt")
    if not (os.path.exists(out_dict) and os.path.samefile(dict_path, out_dict)):
        shutil.copyfile(dict_path, out_dict)
    train_args = options.parse_args_and_arch(
        options.get_training_parser(), plugin_command_line(opts, os.path.abspath(out_dir))
    )
    cfg = convert_namespace_to_omegaconf(train_args)
    task = tasks.setup_task(cfg.task)
    if len(task.source_dictionary) != opts["vocab"]:
        raise ReleaseCheckpointError(
            f"--dict {dict_path} gives {len(task.source_dictionary)} symbols (its lines, fairseq's 4 "
            f"specials and <mask>) but {RELEASE}embed_tokens.weight has {opts['vocab']} rows: pass the "
            "dict.txt shipped with the checkpoint"
        )
    model = task.build_model(cfg.model)
    register_release_heads(model, release)
    model.load_state_dict(map_state_dict(release, model), strict=True)
    state = {
        "args": None,
        "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "model": model.state_dict(),
        "criterion": None,
        "optimizer_history": [{"criterion_name": "MaskedLmLoss", "optimizer_name": "none",
                               "lr_scheduler_state": {}, "num_updates": 0}],
        "task_state": {},
        "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0, "shuffle": False,
                                           "version": 2},
                        "converted_from": os.path.abspath(checkpoint)},
    }
    torch.save(state, target + ".tmp")
    os.replace(target + ".tmp", target)
    logger.info("wrote %s (%s, %d tensors) and %s", target, train_args.arch, len(state["model"]), out_dict)
    return target


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="the release's model.pt")
    parser.add_argument("--dict", required=True, help="the release's dict.txt")
    parser.add_argument("--out", required=True, help="directory for model.pt and dict.txt")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="load with torch.load(weights_only=False): only for a file you trust")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
    for flag, path in (("--checkpoint", args.checkpoint), ("--dict", args.dict)):
        if not os.path.isfile(path):
            parser.error(f"{flag} {path}: no such file")
    try:
        convert(args.checkpoint, args.dict, args.out, args.allow_pickle)
    except ReleaseCheckpointError as error:
        sys.exit(f"convert_official_tupe.py: {error}")


if __name__ == "__main__":
    main()
