"""The TUPE authors' released checkpoint, converted into a plugin checkpoint.

The release (``tupe_ckp.tar.gz``: ``model.pt`` + ``dict.txt``) was saved by the authors' fairseq 0.8 fork
(model ``bert``). Its format, its dictionary and the ways its computation departs from the paper are
described in docs/official_tupe.md; ``tupe-convert-official`` (:mod:`.cli`) is the command line.

* The release's ``args.data`` (the authors' machine) is never read: the configuration is built anew
  from the tensors' shapes (layers, sizes, heads, positions, buckets) and the release's non-shape
  settings (activation, dropouts). The size name of ``--arch`` comes from
  :data:`tupe_plugin.models.architectures.SIZES`. What ``args`` says of the architecture (layers,
  positions, heads, relative term, embedding LayerNorm, pre-LN) must match the tensors: a file that lost
  some of them is refused, not converted as a smaller model.
* The file is read with ``torch.load(weights_only=True)``: only tensors, plain containers, the argparse
  ``Namespace`` fairseq stores and the fork's training meters (``extra_state['train_meters']``,
  unpickled as inert placeholders and dropped) are accepted, so a tampered file cannot run code.
  ``allow_pickle`` lifts that for a file you trust.
* The fork's dictionary has 7 special symbols (``<s> <pad> </s> <unk> <file> <email> <url>``) and its
  ``dict.txt`` lists only the symbols after them. The converted ``dict.txt`` starts with
  ``<file> <email> <url>`` as ordinary entries, so that fairseq's 4 specials plus these three give
  every word the id of its row in the checkpoint.
* Every tensor is mapped; a key the plugin has no place for, a key the plugin needs but the file lacks,
  or a shape that does not fit stops the conversion with the keys named.
* Classification heads of a fine-tuned release checkpoint (``classification_heads.NAME.*``; also
  accepted under ``decoder.``) become RoBERTa classification heads of the same computation at
  inference (dense, tanh, out_proj on ``<s>``); in training RoBERTa's head also applies dropout to the
  features before its dense layer, which the release's head does not.
* The output folder is written aside and renamed into place only when the conversion succeeded; an
  existing ``model.pt`` or ``dict.txt`` there is replaced only with ``force=True``, and never when it is
  the checkpoint or dictionary being converted; other files are kept.
"""

import logging
import os
import pickle
import re
import shutil
import zipfile

import torch

from tupe_plugin.cli.fairseq_tools import PLUGIN_DIR
from tupe_plugin.cli.prepared_folder import make_sibling_folder
from tupe_plugin.fairseq_fixes.checkpoint_compat import load
from tupe_plugin.models.architectures import SIZES
from tupe_plugin.user_input.user_errors import UserError

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
    ("classification_heads.", "classification_heads."),
)
RELEASE_HEAD_PREFIXES = ("classification_heads.", "decoder.classification_heads.")
# The fork's Dictionary: 4 specials as fairseq's, then 3 more, all before the symbols dict.txt lists.
RELEASE_EXTRA_SPECIALS = ("<file>", "<email>", "<url>")
FAIRSEQ_SPECIALS = 4
# The fork's training meters (fairseq 0.8 fairseq/meters.py), pickled in extra_state['train_meters'].
RELEASE_METER_CLASSES = ("AverageMeter", "TimeMeter", "StopwatchMeter")
BUCKET_MATRIX = RELEASE + "rp_bucket"
FUSED_POSITION_PROJ = RELEASE + "pos_proj."
TIED_OUTPUT = "decoder.lm_head.weight"
RELEASE_MAX_DISTANCE = 128
# fairseq 0.8 bert_base defaults for what the release's args may lack
RELEASE_DEFAULTS = dict(activation_fn="gelu", dropout=0.1, attention_dropout=0.1,
                        activation_dropout=0.0, pooler_dropout=0.1, pooler_activation_fn="tanh")
CHECKPOINT_NAME = "model.pt"
PICKLE_PROTOCOL_OPCODE = b"\x80"  # the first byte of torch.save's files before torch 1.6
NO_RELATIVE = "none"
OUTPUT_NAMES = (CHECKPOINT_NAME, "dict.txt")


class ReleaseCheckpointError(UserError, ValueError):
    """The file is not a TUPE release checkpoint the plugin can represent exactly."""


def release_key(plugin_key):
    """The release's state-dict key holding the tensor of ``plugin_key``."""
    plugin_key = re.sub(r"\.self_attn\.in_proj\.(weight|bias)$", r".self_attn.in_proj_\1", plugin_key)
    for plugin_prefix, release_prefix in PREFIXES:
        if plugin_key.startswith(plugin_prefix):
            return release_prefix + plugin_key[len(plugin_prefix):]
    raise KeyError(plugin_key)


class DroppedObject:
    """Stands for an object of the fork that the conversion drops (its training meters): holds nothing."""

    def __setstate__(self, state):
        pass


def _meter_placeholders():
    """(placeholder class, "fairseq.meters.NAME") pairs for torch's weights_only allowlist."""
    placeholders = []
    for name in RELEASE_METER_CLASSES:
        placeholder = type(name, (DroppedObject,), {"__module__": "fairseq.meters"})
        placeholders.append((placeholder, f"fairseq.meters.{name}"))
    return placeholders


def load_release(path, allow_pickle=False):
    """(state dict with float32 tensors, args Namespace or None) of a fairseq 0.8 checkpoint.

    The fork's training meters (``extra_state['train_meters']``) load as inert placeholders and are dropped.
    A file in neither of torch.save's formats (a zip archive, formerly a pickle), or one that ends early, is
    refused as not a complete PyTorch checkpoint.
    """
    with open(path, "rb") as f:
        pickled = f.read(1) == PICKLE_PROTOCOL_OPCODE
    if not (pickled or zipfile.is_zipfile(path)):
        raise _incomplete_checkpoint(path)
    try:
        if allow_pickle:
            state = torch.load(path, map_location="cpu", weights_only=False)
        else:
            with torch.serialization.safe_globals(_meter_placeholders()):
                state = load(path, "--checkpoint", fix="if you trust the file, rerun with --allow-pickle")
    # torch's "unexpected EOF", "failed finding central directory", "invalid load key"
    except (EOFError, RuntimeError, pickle.UnpicklingError) as error:
        raise _incomplete_checkpoint(path) from error
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise ReleaseCheckpointError(
            f"{path} is not a fairseq checkpoint: expected a dict with a 'model' state dict"
        )
    extra_state = state.get("extra_state")
    if isinstance(extra_state, dict) and "train_meters" in extra_state:
        logger.info("dropped extra_state['train_meters'] (%d training meters of the fork; a converted "
                    "checkpoint starts new meters)", len(extra_state["train_meters"] or ()))
    model = {}
    for key, value in state["model"].items():
        if key.startswith("decoder.classification_heads."):
            key = key[len("decoder."):]
        model[key] = value.float() if value.is_floating_point() else value
    return _split_fused_position_proj(model), state.get("args")


def _incomplete_checkpoint(path):
    return ReleaseCheckpointError(
        f"--checkpoint {path} ({os.path.getsize(path)} bytes) is not a complete PyTorch checkpoint: it is "
        "truncated or not a file written by torch.save; pass the release's model.pt (extract tupe_ckp.tar.gz "
        "again)"
    )


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
    layernorm_embedding = RELEASE + "emb_layer_norm.weight" in model
    _check_saved_args(saved, {
        "encoder_layers": (max(layers) + 1, f"holds {max(layers) + 1} encoder layers ({RELEASE}layers.N.*)"),
        "max_positions": (table_rows - 1, f"has {table_rows} rows in pos.weight (max_positions + 1)"),
        "rel_pos": (relative is not None,
                    f"{'has' if relative is not None else 'lacks'} relative_attention_bias.weight (TUPE-R's "
                    "relative term)"),
        "embedding_normalize": (layernorm_embedding,
                                f"{'has' if layernorm_embedding else 'lacks'} emb_layer_norm.weight (the "
                                "LayerNorm on the word embeddings)"),
    })
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
        rel_pos="t5" if relative is not None else NO_RELATIVE,
        rel_pos_buckets=relative.size(0) - 1 if relative is not None else 32,
        layernorm_embedding=layernorm_embedding,
        encoder_normalize_before=prenorm,
    )
    return opts


def _check_saved_args(saved, held):
    """Stop when a setting of the release's ``args`` differs from what the tensors hold.

    ``held`` maps an ``args`` name to (the tensors' value, what the checkpoint holds, in words).
    """
    for name, (value, in_words) in held.items():
        if name in saved and saved[name] != value:
            raise ReleaseCheckpointError(
                f"args.{name} = {saved[name]} but the checkpoint {in_words}: its tensors are not those of "
                "the model its args describe (a damaged or edited file); convert the release's own model.pt"
            )


def plugin_command_line(opts, data_dir):
    """The fairseq-train command line (after ``fairseq-train``) of the converted model."""
    dims = (opts["encoder_layers"], opts["encoder_embed_dim"], opts["encoder_attention_heads"],
            opts["encoder_ffn_embed_dim"])
    size = next((name for name, preset in SIZES.items() if preset == dims), "base")  # flags set the rest
    row = "tupe_a" if opts["rel_pos"] == NO_RELATIVE else "tupe_r"  # flags set the relative term anyway
    arch = f"{row}_{size}"
    line = [
        data_dir, "--user-dir", PLUGIN_DIR,
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
    prefix = "classification_heads."
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


def read_dict_lines(dict_path):
    with open(dict_path, encoding="utf-8") as f:
        return [line for line in f if line.strip()]


def release_dictionary(dict_path, rows):
    """The lines of a ``dict.txt`` whose ids, read by fairseq (4 specials, then the lines, then
    ``<mask>``), are the checkpoint's embedding rows; and how many special symbols the release had."""
    lines = read_dict_lines(dict_path)
    symbols = [line.split()[0] for line in lines[:len(RELEASE_EXTRA_SPECIALS)]]
    if rows == FAIRSEQ_SPECIALS + len(lines) + 1:
        listed = tuple(symbols) == RELEASE_EXTRA_SPECIALS
        return lines, FAIRSEQ_SPECIALS + (len(RELEASE_EXTRA_SPECIALS) if listed else 0)
    release_specials = FAIRSEQ_SPECIALS + len(RELEASE_EXTRA_SPECIALS)
    if rows == release_specials + len(lines) + 1 and tuple(symbols) != RELEASE_EXTRA_SPECIALS:
        return [f"{symbol} 0\n" for symbol in RELEASE_EXTRA_SPECIALS] + lines, release_specials
    raise ReleaseCheckpointError(
        f"--dict {dict_path} lists {len(lines)} symbols, but {RELEASE}embed_tokens.weight has {rows} rows; "
        f"the release's dict.txt gives {release_specials + len(lines) + 1} rows (its {release_specials} "
        f"special symbols, the listed ones and <mask>), a fairseq 0.12 one "
        f"{FAIRSEQ_SPECIALS + len(lines) + 1}: pass the dict.txt that was saved with this checkpoint"
    )


def check_inputs_outside(out_dir, checkpoint, dict_path):
    """Refuse an ``out_dir`` whose model.pt or dict.txt is the file converted: it would be replaced."""
    real_out = os.path.realpath(out_dir)
    replaced = [f"{flag} {path}" for flag, path, name in (("--checkpoint", checkpoint, CHECKPOINT_NAME),
                                                          ("--dict", dict_path, "dict.txt"))
                if os.path.realpath(path) == os.path.join(real_out, name)]
    if replaced:
        raise ReleaseCheckpointError(
            f"--out {out_dir} holds the input {' and '.join(replaced)}, which the converted files would "
            "replace (--force or not): give another --out"
        )


def check_output_folder(out_dir, force=False, names=OUTPUT_NAMES):
    """Refuse ``out_dir`` when it is a file, or holds one of ``names`` (model.pt, dict.txt) and ``force``
    is off."""
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        raise ReleaseCheckpointError(f"--out {out_dir} is a file; give a folder")
    existing = [name for name in names
                if os.path.lexists(os.path.join(out_dir, name))]
    if existing and not force:
        raise ReleaseCheckpointError(
            f"--out {out_dir} already holds {' and '.join(existing)}; nothing is overwritten: choose another "
            "--out, or add --force to replace them once the conversion has succeeded"
        )


def convert(checkpoint, dict_path, out_dir, allow_pickle=False, force=False):
    """Write ``out_dir/model.pt`` and ``out_dir/dict.txt``; return the checkpoint path.

    Both are written into a folder beside ``out_dir`` first and moved into place only when the
    conversion succeeded. Existing ``model.pt`` / ``dict.txt`` in ``out_dir`` are replaced only with
    ``force``, and never when they are ``checkpoint`` or ``dict_path``; other files there are never touched.
    """
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    out_dir = os.path.abspath(out_dir)
    check_inputs_outside(out_dir, checkpoint, dict_path)
    check_output_folder(out_dir, force)
    release, args = load_release(checkpoint, allow_pickle)
    opts = release_options(release, args)
    lines, specials = release_dictionary(dict_path, opts["vocab"])
    folder = make_sibling_folder(out_dir)
    try:
        with open(os.path.join(folder, "dict.txt"), "w", encoding="utf-8") as f:
            f.writelines(lines)
        train_args = options.parse_args_and_arch(
            options.get_training_parser(), plugin_command_line(opts, folder)
        )
        cfg = convert_namespace_to_omegaconf(train_args)
        task = tasks.setup_task(cfg.task)
        assert len(task.source_dictionary) == opts["vocab"], "dictionary rows"
        model = task.build_model(cfg.model)
        register_release_heads(model, release)
        model.load_state_dict(map_state_dict(release, model), strict=True)
        cfg.task.data = out_dir
        state = converted_state(cfg, model, checkpoint, release_special_symbols=specials)
        torch.save(state, os.path.join(folder, CHECKPOINT_NAME))
        move_into_place(folder, out_dir, force)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    target = os.path.join(out_dir, CHECKPOINT_NAME)
    if specials > FAIRSEQ_SPECIALS:
        logger.info("dict.txt: the release's %d special symbols kept their ids (%s written as the first "
                    "entries)", specials, " ".join(RELEASE_EXTRA_SPECIALS))
    logger.info("wrote %s (%s, %d tensors) and %s", target, train_args.arch, len(state["model"]),
                os.path.join(out_dir, "dict.txt"))
    return target


def converted_state(cfg, model, source, **extra_state):
    """A fairseq checkpoint of a converted ``model`` and its ``cfg``: no optimizer state, a fresh data
    position, ``converted_from`` (the absolute ``source``) and ``extra_state`` in its extra state."""
    from omegaconf import OmegaConf

    return {
        "args": None,
        "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "model": model.state_dict(),
        "criterion": None,
        "optimizer_history": [{"criterion_name": "MaskedLmLoss", "optimizer_name": "none",
                               "lr_scheduler_state": {}, "num_updates": 0}],
        "task_state": {},
        "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0, "shuffle": False,
                                           "version": 2},
                        "converted_from": os.path.abspath(source), **extra_state},
    }


def move_into_place(folder, out_dir, force, names=OUTPUT_NAMES):
    """Move ``names`` from ``folder`` into ``out_dir`` (renamed into place when it does not exist yet)."""
    if not os.path.lexists(out_dir):
        os.rename(folder, out_dir)
        return
    check_output_folder(out_dir, force, names)  # again: the folder may have changed during the conversion
    # model.pt last: it is what marks a finished conversion
    for name in sorted(names, key=lambda name: name == CHECKPOINT_NAME):
        os.replace(os.path.join(folder, name), os.path.join(out_dir, name))
