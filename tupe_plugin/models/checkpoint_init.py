"""``--init-from-checkpoint CKPT``: a new model of the command line's architecture from pre-trained weights.

The protocol of Wang et al., "On Position Embeddings in BERT" (ICLR 2021), which take
BERT-base, replace its absolute position module by each new encoding and continue pre-training. The
model is built from the command line (any plugin architecture); every tensor of CKPT whose name and
shape match is copied into it (word embeddings, layers, LM head, embedding LayerNorm); the parameters
the checkpoint lacks keep their initialisation. Logged one line per group: copied, newly initialised,
dropped (the checkpoint's tensors the model has no place for, e.g. the learned table when moving to
TUPE-R or RoPE). A tensor both have with other shapes stops the build, except a learned position table
of another length: the rows both have are copied and the others initialised fresh
(``--init-extra-positions init``) or filled by repeating the checkpoint's rows (``copy-repeat``).
``--init-untied-from-absolute`` starts TUPE's untied table from the checkpoint's absolute one when
their widths match (BERT-A -> TUPE-A/R). CKPT may be a plugin checkpoint or fairseq's own RoBERTa
(:mod:`.stock_roberta`).

Only a new model is initialised, as with :mod:`.embedding_init`: ``args.init_from_checkpoint_applied``
is set once done, so a model rebuilt from a saved config (fairseq-validate, from_pretrained) never
re-reads CKPT, and a rerun of fairseq-train that resumes from its own ``checkpoint_last.pt`` skips it
(:mod:`tupe_plugin.policies.swap_resume`). Optimizer, meters and data position are a new run's.
"""

import logging
import os
import re

import torch
from fairseq.utils import safe_getattr

from ..checkpoints.checkpoint_config import model_config
from ..fairseq_fixes.checkpoint_compat import load
from ..fairseq_fixes.checkpoint_integrity import verify_checkpoint
from ..fairseq_fixes.unreadable_checkpoints import raise_if_unreadable
from ..user_input.path_checks import path_problem
from . import stock_roberta
from .checkpoint_guards import (HEAD_PREFIXES, CheckpointMismatchError, DictionaryMismatchError,
                               dictionary_fingerprint)

logger = logging.getLogger(__name__)

EXTRA_POSITIONS_CHOICES = ("init", "copy-repeat")
ABSOLUTE_TABLE = "encoder.sentence_encoder.embed_positions.weight"
UNTIED_TABLE = "encoder.sentence_encoder.positional_term.untied_position.embed_positions.weight"
VOCABULARY_TENSORS = ("encoder.sentence_encoder.embed_tokens.weight", "encoder.lm_head.weight",
                      "encoder.lm_head.bias")
_LAYER = re.compile(r"encoder\.sentence_encoder\.layers\.(\d+)\.")
_GROUPS = (("encoder.sentence_encoder.embed_tokens.", "word embeddings"), ("encoder.lm_head.", "LM head"),
           ("encoder.sentence_encoder.layernorm_embedding.", "embedding LayerNorm"),
           ("encoder.sentence_encoder.layer_norm.", "final LayerNorm"))
_GROUP_PREFIXES = tuple(prefix for prefix, _ in _GROUPS)


class MissingInitCheckpointError(CheckpointMismatchError, FileNotFoundError):
    """A ``--init-from-checkpoint`` file that does not exist."""


def add_args(group):
    group.add_argument(
        "--init-from-checkpoint",
        metavar="CKPT",
        help="start a new run from the weights of CKPT (a plugin or fairseq RoBERTa checkpoint): the model "
        "is built from this command line and every tensor of CKPT of the same name and shape is copied; "
        "the new position parameters keep their initialisation (docs/starting_points.md)",
    )
    group.add_argument(
        "--init-extra-positions",
        choices=EXTRA_POSITIONS_CHOICES,
        help="rows of a learned position table beyond the checkpoint's (a 128 -> 512 stage): init "
        "(default) keeps their fresh initialisation, copy-repeat repeats the checkpoint's rows",
    )
    group.add_argument(
        "--init-untied-from-absolute",
        action="store_true",
        help="start TUPE's untied position table from the checkpoint's absolute table (BERT-A -> "
        "TUPE-A/R) when their widths match, instead of a fresh one",
    )


def set_defaults(args):
    args.init_from_checkpoint = safe_getattr(args, "init_from_checkpoint", None)
    args.init_extra_positions = safe_getattr(args, "init_extra_positions", "init")
    args.init_untied_from_absolute = safe_getattr(args, "init_untied_from_absolute", False)
    args.init_from_checkpoint_applied = safe_getattr(args, "init_from_checkpoint_applied", False)


def check_exists(path):
    if not os.path.isfile(path):
        raise MissingInitCheckpointError(
            f"--init-from-checkpoint {path}: {path_problem(path)}: give a checkpoint file (a plugin "
            "checkpoint, or fairseq RoBERTa's model.pt)" if os.path.exists(path) else
            f"--init-from-checkpoint {path} does not exist: correct the path (a plugin checkpoint, or "
            "fairseq RoBERTa's model.pt)"
        )


def initialize_from_flags(model, args, dictionary):
    """Copy the ``--init-from-checkpoint`` weights into a new ``model`` (once; nothing without the flag)."""
    if not args.init_from_checkpoint or args.init_from_checkpoint_applied:
        return
    path = args.init_from_checkpoint
    if args.embed_init_path:
        raise CheckpointMismatchError(
            f"--embed-init-path {args.embed_init_path} and --init-from-checkpoint {path} both initialise the "
            "word embeddings: give one"
        )
    weights, saved_cfg = read_checkpoint(path, model.encoder.sentence_encoder.padding_idx)
    _check_dictionary(path, saved_cfg, dictionary)
    _carry_layer_norm_eps(path, saved_cfg, args)
    swap(model, weights, path, args.init_extra_positions, args.init_untied_from_absolute)
    args.init_from_checkpoint_applied = True


def read_checkpoint(path, padding_idx):
    """(weights with the plugin's names, the checkpoint's model config) of the fairseq checkpoint ``path``."""
    check_exists(path)
    verify_checkpoint(path)
    try:
        state = load(path, "--init-from-checkpoint")
    except Exception as err:
        raise_if_unreadable(path, err)
        raise
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise CheckpointMismatchError(
            f"--init-from-checkpoint {path} holds no fairseq checkpoint (no 'model' weights): pass a "
            "checkpoint written by fairseq-train"
        )
    weights = state["model"]
    if stock_roberta.is_stock_roberta(weights):
        stock_roberta.to_plugin_names(weights, "", padding_idx)
    return weights, model_config(state)


def _recorded(saved_cfg, name):
    return saved_cfg.get(name) if isinstance(saved_cfg, dict) else safe_getattr(saved_cfg, name, None)


def _carry_layer_norm_eps(path, saved_cfg, args):
    """The checkpoint's ``--layer-norm-eps`` (BERT's 1e-12) for a command line that gives none."""
    saved = _recorded(saved_cfg, "layer_norm_eps")
    if args.layer_norm_eps is None and saved is not None:
        args.layer_norm_eps = saved
        logger.info(f"--init-from-checkpoint {path}: its LayerNorm epsilon {saved:g} carried "
                    "(--layer-norm-eps to give another)")


def _check_dictionary(path, saved_cfg, dictionary):
    """A dictionary of the checkpoint's size with other symbols (another size: the shapes say it)."""
    fingerprint = _recorded(saved_cfg, "dictionary_fingerprint")
    if fingerprint not in (None, dictionary_fingerprint(dictionary)) \
            and _recorded(saved_cfg, "dictionary_size") in (None, len(dictionary)):
        raise DictionaryMismatchError(
            f"--init-from-checkpoint {path} was trained with another dictionary (fingerprint {fingerprint}) "
            f"than the data's ({dictionary_fingerprint(dictionary)}): token ids would mean other words; "
            "binarize the data against its dict.txt (fairseq-preprocess --srcdict CKPT-DATA/dict.txt)"
        )


def swap(model, weights, path, extra_positions="init", untied_from_absolute=False):
    """Copy into ``model`` every tensor of ``weights`` (plugin names) whose name and shape match; log it."""
    own = model.state_dict()
    copied, new, plan, notes = [], [], [], []
    for name, tensor in own.items():
        saved = weights.get(name)
        if name.startswith(HEAD_PREFIXES):
            continue
        if saved is None:
            new.append(name)
        elif saved.shape == tensor.shape:
            plan.append((tensor, saved))
            copied.append(name)
        elif name.endswith("embed_positions.weight") and saved.shape[1:] == tensor.shape[1:]:
            plan.append((tensor, _resized_table(saved, tensor, extra_positions)))
            copied.append(name)
            notes.append(f"{_short([name])}: {_table_note(saved, tensor, extra_positions)}")
        else:
            raise CheckpointMismatchError(
                f"--init-from-checkpoint {path}: {name} is {tuple(saved.shape)} in the checkpoint but "
                f"{tuple(tensor.shape)} in the model of this command; {_mismatch_fix(name)}"
            )
    used = set(copied)
    if untied_from_absolute:
        notes.append(_untied_from_absolute(own, weights, new, plan, used, extra_positions))
    for target, value in plan:
        with torch.no_grad():
            target.copy_(value.to(target.dtype))
    dropped = [name for name in weights if name not in own and name not in used]
    logger.info(f"--init-from-checkpoint {path}: copied {len(copied)} tensors: {_groups(copied)}")
    logger.info(f"--init-from-checkpoint {path}: newly initialised: {_short(new)}")
    logger.info(f"--init-from-checkpoint {path}: dropped from the checkpoint: {_short(dropped)}")
    for note in filter(None, notes):
        logger.info(f"--init-from-checkpoint {path}: {note}")
    return {"copied": copied, "new": new, "dropped": dropped}


def _resized_table(saved, table, extra_positions):
    """The rows ``table`` and ``saved`` share copied; the others fresh, or ``saved`` repeated."""
    rows = min(saved.size(0), table.size(0))
    resized = table.detach().clone()
    resized[:rows] = saved[:rows]
    if extra_positions == "copy-repeat" and table.size(0) > saved.size(0):
        repeats = -(-table.size(0) // saved.size(0))
        resized[rows:] = saved.repeat(repeats, 1)[rows:table.size(0)]
    return resized


def _table_note(saved, table, extra_positions):
    kept, wanted = saved.size(0), table.size(0)
    if wanted == kept:
        return f"the checkpoint's {kept} rows copied"
    if wanted < kept:
        return f"the first {wanted} of the checkpoint's {kept} rows copied, the rest dropped"
    how = "repeat the checkpoint's rows" if extra_positions == "copy-repeat" else "are initialised fresh"
    return (f"the checkpoint's {kept} rows copied, rows {kept}-{wanted - 1} {how} "
            f"(--init-extra-positions {extra_positions})")


def _untied_from_absolute(own, weights, new, plan, used, extra_positions):
    """TUPE's untied table from the checkpoint's absolute one (--init-untied-from-absolute); the note."""
    saved, table = weights.get(ABSOLUTE_TABLE), own.get(UNTIED_TABLE)
    if table is None or saved is None or UNTIED_TABLE not in new:
        return "--init-untied-from-absolute: no untied table to start from an absolute one here: fresh"
    if saved.shape[1:] != table.shape[1:]:
        return (f"--init-untied-from-absolute: the absolute table is {saved.size(1)} wide, the untied one "
                f"{table.size(1)}: the untied table is initialised fresh")
    plan.append((table, _resized_table(saved, table, extra_positions)))
    new.remove(UNTIED_TABLE)
    used.add(ABSOLUTE_TABLE)
    return (f"the untied position table starts from the checkpoint's absolute table: "
            f"{_table_note(saved, table, extra_positions)} (--init-untied-from-absolute)")


def _mismatch_fix(name):
    if name in VOCABULARY_TENSORS:
        return ("another vocabulary: binarize the data against the checkpoint's dict.txt "
                "(fairseq-preprocess --srcdict CKPT-DATA/dict.txt)")
    return ("give the size flags the checkpoint was trained with (its cfg.model: --encoder-embed-dim, "
            "--encoder-ffn-embed-dim, --encoder-attention-heads, the position flags of this tensor)")


def _short(names):
    return ", ".join(name.replace("encoder.sentence_encoder.", "") for name in names) or "none"


def _groups(names):
    """``names`` summarised: word embeddings, layers 0-11, LM head, embedding LayerNorm, then the others."""
    layers = sorted({int(match.group(1)) for match in map(_LAYER.match, names) if match})
    groups = [label for prefix, label in _GROUPS if any(name.startswith(prefix) for name in names)]
    if layers:
        groups.insert(int("word embeddings" in groups), f"layers {layers[0]}-{layers[-1]}")
    others = [name for name in names if not _LAYER.match(name) and not name.startswith(_GROUP_PREFIXES)]
    return ", ".join(groups + ([_short(others)] if others else [])) or "none"
