"""``tupe-convert-hf`` on a folder written by ``tupe-export-hf``: the plugin checkpoint again, same tensors.

The model flags come back from ``config.json``'s ``fairseq_model_args`` (and a pre-training's task settings,
such as ``sample_break_mode``, from ``fairseq_task_args``, so that the checkpoint validates as the original
did), the tensors from
``model.safetensors`` by the name table of :mod:`.hf_names` read the other way (the masked-LM head's weight
from the word embeddings, as the export tied them), or, for a native export (transformers' own
``model_type``), by its class's names read back (:mod:`.hf_native`, with the tensors config.json keeps
under ``fairseq_tensors``); the exported classification and span heads under their names of
``fairseq_head_names``. The export of a classifier or a span head holds no masked-LM head
(:func:`~.hf_names.exported_head`): the checkpoint's is then freshly initialised (its weight tied to the word
embeddings), as fairseq builds it, and a log line says so. ``OUT/dict.txt`` lists ``vocab.txt`` without
fairseq's specials and ``<mask>``; the sentencepiece model is copied beside it, so ``from_pretrained(OUT)``
encodes text as before.
"""

import argparse
import json
import logging
import os
import shutil

import torch

from tupe_plugin.cli.fairseq_tools import PLUGIN_DIR
from tupe_plugin.cli.prepared_folder import make_sibling_folder
from tupe_plugin.conversion import hf_native
from tupe_plugin.conversion.hf_names import EXPORT_MODEL_TYPE, LM_HEAD, TIED, exported_head, rename
from tupe_plugin.conversion.official_tupe import (CHECKPOINT_NAME, check_output_folder, converted_state,
                                                  move_into_place)
from tupe_plugin.user_input.user_errors import UserError

logger = logging.getLogger("convert_hf")

SPECIALS, MASK = ("<s>", "<pad>", "</s>", "<unk>"), "<mask>"
SENTENCEPIECE_MODEL = "sentencepiece.bpe.model"
OUTPUT_NAMES = (CHECKPOINT_NAME, "dict.txt", SENTENCEPIECE_MODEL)


class ExportFolderError(UserError, ValueError):
    """An exported folder that does not give a plugin checkpoint back."""


def read_vocabulary(hf_dir):
    """dict.txt's lines of the export's vocab.txt (fairseq's ids: specials first, <mask> last)."""
    path = os.path.join(hf_dir, "vocab.txt")
    if not os.path.isfile(path):
        raise ExportFolderError(f"--hf-model {hf_dir} has no vocab.txt: pass a folder written by "
                                "tupe-export-hf")
    with open(path, encoding="utf-8") as f:
        symbols = [line.rstrip("\n") for line in f]
    if tuple(symbols[:4]) != SPECIALS or symbols[-1] != MASK:
        raise ExportFolderError(f"{path} does not start with {' '.join(SPECIALS)} and end with {MASK}, as "
                                "tupe-export-hf writes it: export the checkpoint again")
    return [f"{symbol} 1\n" for symbol in symbols[4:-1]]


def is_export(config):
    """Whether a folder's ``config`` is one ``tupe-export-hf`` wrote (remote-code or native)."""
    return config.get("model_type") == EXPORT_MODEL_TYPE or "fairseq_model_args" in config


def check_recorded_model(config, path, vocabulary_size):
    """Refuse an export whose transformers fields (those ``tupe-export-hf`` writes from the model's flags)
    disagree with the flags it records in ``fairseq_model_args``, which the checkpoint is rebuilt from: an
    edited config.json would give transformers one model and the conversion another."""
    from tupe_plugin.conversion.hf_export import model_fields
    from tupe_plugin.encodings.position_config import PositionConfig

    args = argparse.Namespace(**config["fairseq_model_args"])
    vocabulary = [None] * vocabulary_size
    try:
        if config.get("model_type") == EXPORT_MODEL_TYPE:
            expected = model_fields(args, vocabulary)
        elif (native := hf_native.CLASSES.get(config.get("model_type"))) is not None:
            expected = native.config(args, vocabulary, PositionConfig.from_args(args))
        else:  # refused by native_plugin_state, naming the model_type
            expected = {}
    except AttributeError as error:
        raise ExportFolderError(f"{path}: fairseq_model_args has no {error.name}, which tupe-export-hf "
                                "records: export the checkpoint again") from None
    for field, value in expected.items():
        if field in config and config[field] != value:
            raise ExportFolderError(
                f"{path}: {field} = {json.dumps(config[field])}, but the model recorded in its "
                f"fairseq_model_args, which the checkpoint is rebuilt from, has {json.dumps(value)}: the "
                "folder was edited after tupe-export-hf wrote it; export the checkpoint again, or restore "
                "the field")


def native_plugin_state(config, weights, heads, path):
    """The plugin state dict of a native export's tensors (its class's names read back)."""
    from tupe_plugin.encodings.position_config import PositionConfig

    native = hf_native.CLASSES.get(config.get("model_type"))
    if native is None:
        raise ExportFolderError(f"{path}: model_type {config.get('model_type')!r} is not one tupe-export-hf "
                                f"writes ({', '.join(hf_native.CLASSES)} or {EXPORT_MODEL_TYPE!r})")
    args = argparse.Namespace(**config["fairseq_model_args"])
    kept = {key: torch.tensor(value, dtype=torch.float32)
            for key, value in (config.get("fairseq_tensors") or {}).items()}
    try:
        return native.plugin_state(weights, args, PositionConfig.from_args(args), heads, kept)
    except KeyError as error:
        raise ExportFolderError(f"{path} has no {error.args[0]}, which {native.name}'s export writes: export "
                                "the checkpoint again") from None


def plugin_state(weights, heads, path):
    """The plugin state dict of the exported tensors; a tensor without a row in the name table is refused."""
    state, unmapped = {}, []
    for name, tensor in weights.items():
        key = rename(name, heads, to_hf=False)
        if key is None:
            unmapped.append(name)
        else:
            state[key] = tensor
    if unmapped:
        raise ExportFolderError(f"{path}: no place in the plugin for {', '.join(sorted(unmapped)[:4])}")
    state[TIED[0]] = state[TIED[1]]
    return state


def restore_task_settings(cfg, task_args):
    """Give ``cfg`` the pre-training's task settings an export kept (``fairseq_task_args``): how its text
    was cut into blocks (``sample_break_mode``, ``tokens_per_sample``), masked (``mask_prob``, ...), and the
    seed the masks are drawn with, which fairseq's masked_lm task reads from the common settings
    (``common.seed``), recorded there too as fairseq-train records it; so that ``fairseq-validate`` reads the
    converted checkpoint's blocks and masks as the original's. An export without them (of another task, or
    written before they were kept) leaves fairseq's defaults."""
    if task_args.get("_name") != cfg.task._name:
        return
    for key, value in task_args.items():
        for settings in (cfg.task, cfg.model):
            if key != "_name" and key in settings:
                setattr(settings, key, value)
    if isinstance(task_args.get("seed"), int):
        cfg.common.seed = task_args["seed"]


def fresh_masked_lm_head(model, state, heads, path):
    """{plugin key: tensor} of ``model``'s freshly initialised masked-LM head tensors that ``state`` lacks:
    those of an export of a classifier or a span head, which holds none (said in a log line); a masked-LM
    export that lacks them is refused."""
    fresh = {key: value for key, value in model.state_dict().items()
             if key.startswith(LM_HEAD) and key not in state}
    if not fresh:
        return {}
    names = ", ".join(sorted(key[len(LM_HEAD):] for key in fresh))
    if exported_head(heads) == "masked_lm":
        raise ExportFolderError(f"{path} has no masked-LM head ({LM_HEAD}{{{names}}}), which the export of a "
                                "masked LM holds: export the checkpoint again")
    logger.info("the export of a %s head holds no masked-LM head: the checkpoint's (%s{%s}) is freshly "
                "initialised, its weight tied to the word embeddings", exported_head(heads), LM_HEAD, names)
    return fresh


def convert_export(hf_dir, out_dir, config, weights, weights_path, arch=None, force=False):
    """Write ``out_dir/model.pt``, ``dict.txt`` and the sentencepiece model of an exported folder; return the
    checkpoint path."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    model_args = config.get("fairseq_model_args")
    if not isinstance(model_args, dict) or "arch" not in model_args:
        raise ExportFolderError(f"{os.path.join(hf_dir, 'config.json')} has no fairseq_model_args: pass a "
                                "folder written by tupe-export-hf")
    if arch not in (None, model_args["arch"]):
        raise ExportFolderError(f"--arch {arch}: an exported folder converts back to its own architecture "
                                f"({model_args['arch']}); leave --arch out")
    if not os.path.isfile(os.path.join(hf_dir, SENTENCEPIECE_MODEL)):
        raise ExportFolderError(f"--hf-model {hf_dir} has no {SENTENCEPIECE_MODEL}: pass a folder written by "
                                "tupe-export-hf")
    check_output_folder(out_dir, force, OUTPUT_NAMES)
    lines = read_vocabulary(hf_dir)
    check_recorded_model(config, os.path.join(hf_dir, "config.json"), len(lines) + len(SPECIALS) + 1)
    heads = config.get("fairseq_head_names") or {}
    if config.get("model_type") == EXPORT_MODEL_TYPE:
        state = plugin_state(weights, heads, weights_path)
    else:
        state = native_plugin_state(config, weights, heads, weights_path)
    folder = make_sibling_folder(out_dir)
    try:
        with open(os.path.join(folder, "dict.txt"), "w", encoding="utf-8") as f:
            f.writelines(lines)
        shutil.copyfile(os.path.join(hf_dir, SENTENCEPIECE_MODEL), os.path.join(folder, SENTENCEPIECE_MODEL))
        train_args = options.parse_args_and_arch(options.get_training_parser(), [
            folder, "--user-dir", PLUGIN_DIR, "--task", "masked_lm", "--criterion", "masked_lm",
            "--arch", model_args["arch"], "--tokens-per-sample", str(model_args["max_positions"])])
        cfg = convert_namespace_to_omegaconf(train_args)
        for key, value in model_args.items():
            setattr(cfg.model, key, value)
        restore_task_settings(cfg, config.get("fairseq_task_args") or {})
        task = tasks.setup_task(cfg.task)
        model = task.build_model(cfg.model)
        if heads.get("classification"):
            classes = state[f"classification_heads.{heads['classification']}.out_proj.weight"].size(0)
            model.register_classification_head(heads["classification"], num_classes=classes)
        if heads.get("span"):
            model.register_span_head(heads["span"])
        state.update(fresh_masked_lm_head(model, state, heads, weights_path))
        model.load_state_dict(state, strict=True)
        cfg.task.data = cfg.model.data = out_dir  # not the folder it was written in
        torch.save(converted_state(cfg, model, hf_dir), os.path.join(folder, CHECKPOINT_NAME))
        move_into_place(folder, out_dir, force, OUTPUT_NAMES)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    target = os.path.join(out_dir, CHECKPOINT_NAME)
    logger.info("wrote %s (%s, %d tensors), dict.txt and %s", target, model_args["arch"], len(state),
                SENTENCEPIECE_MODEL)
    return target
