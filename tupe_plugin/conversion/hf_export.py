"""Export a plugin checkpoint as a transformers model.

    tupe-export-hf CKPT DATA_BIN --out DIR [--head NAME] [--force] [--remote-code]

DATA_BIN is the folder with the checkpoint's ``dict.txt`` and ``sentencepiece.bpe.model`` (as
``tupe-finetune-glue`` takes it). A model that one of transformers' own classes computes (RoBERTa for the
absolute encodings and none, RoFormer for the fixed RoPE, DeBERTa-v2 for DeBERTa without the Enhanced Mask
Decoder: :mod:`.hf_native`) is written as that class: DIR receives its ``config.json``
(transformers' ``model_type``, no ``auto_map``) and its weights, and loads without remote code. Every other
model (or any with ``--remote-code``) is the remote-code model: ``config.json`` (every model flag of the
checkpoint, its ``auto_map``), ``model.safetensors`` (the names of :mod:`.hf_names`), the modeling and
configuration code of ``hf_remote/`` (transformers' ``trust_remote_code``); the export says why it is not
native. Both hold the tokenizer, the dictionary's ``vocab.txt`` (fairseq's ids in order) and sentencepiece
model, and a model card (``README.md``, with file names, never paths, saying which kind the export is).
The tokenizer is a standard ``tokenizer.json`` (:mod:`.hf_tokenizer`): ``AutoTokenizer.from_pretrained(DIR)``
loads it without remote code as a fast tokenizer; a model whose ids it cannot give keeps the custom
sentencepiece tokenizer of ``hf_remote/`` (``trust_remote_code=True``), and the export says why.
``AutoModel``/``AutoModelForMaskedLM``/``AutoModelForSequenceClassification``/
``AutoModelForQuestionAnswering.from_pretrained(DIR)`` (with ``trust_remote_code=True`` for the remote-code
form) load the model with torch and transformers only. A fine-tuned checkpoint's classification head (its
number of classes, a regression head, the labels of its data's ``label/dict.txt``) and span head are
exported; a checkpoint with several of one kind needs ``--head``. The export of one classification or one
span head holds no masked-LM head (:func:`~.hf_names.exported_head`), so that its class loads it without
weights it does not read. The model card (:func:`model_card`) starts with the Hugging Face Hub's YAML header
and says what the model was pre-trained on and, for a fine-tune, its task, labels and dev score. Every input
is checked before anything is written, as fairseq-validate and the fine-tuning tools check it (the
dictionary's fingerprint, the sentencepiece model, the checkpoint's checksums; an ``--out`` that is, holds or
lies inside an input is refused, ``--force`` replaces only a previous export that holds nothing else); the
folder is written aside and moved into place.
"""

import argparse
import json
import logging
import os
import pickle
import shutil
import sys

import torch
import yaml

from tupe_plugin.cli.extras import MissingExtraError, require
from tupe_plugin.cli.prepared_folder import make_sibling_folder
from tupe_plugin.conversion import hf_native, hf_tokenizer
from tupe_plugin.conversion.hf_names import (EXPORT_MODEL_TYPE, LM_HEAD, TIED, exported_head, rename,
                                             write_safetensors)
from tupe_plugin.encodings import registry
from tupe_plugin.encodings.encoding import flag_name
from tupe_plugin.encodings.position_config import DEFAULTS, PositionConfig
from tupe_plugin.models.model_flags import value_in_use
from tupe_plugin.user_input.overwritten_inputs import folder_meeting_input
from tupe_plugin.user_input.path_checks import path_problem
from tupe_plugin.user_input.user_errors import UserError

logger = logging.getLogger("export_hf")

REMOTE_CODE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_remote")
CODE_FILES = ("configuration_tupe.py", "modeling_tupe.py")
TOKENIZER_CODE = "tokenization_tupe.py"
SENTENCEPIECE_MODEL = "sentencepiece.bpe.model"
# Every name an export writes (with tokenizer.json, or the custom tokenizer's code): --force replaces a folder
# that holds no other
EXPORT_FILES = frozenset({"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
                          TOKENIZER_CODE, "vocab.txt", SENTENCEPIECE_MODEL, *CODE_FILES, "README.md"})
AUTO_MAP = {
    "AutoConfig": "configuration_tupe.TupeConfig",
    "AutoModel": "modeling_tupe.TupeModel",
    "AutoModelForMaskedLM": "modeling_tupe.TupeForMaskedLM",
    "AutoModelForSequenceClassification": "modeling_tupe.TupeForSequenceClassification",
    "AutoModelForQuestionAnswering": "modeling_tupe.TupeForQuestionAnswering",
}
TOKENIZER_AUTO_MAP = {"AutoTokenizer": ["tokenization_tupe.TupeTokenizer", None]}
# every position flag (the families', --cls-reset and every registered encoding's options), written into
# config.json as the exported code reads them
POSITION_FLAGS = tuple(DEFAULTS)
ACTIVATIONS = ("gelu", "gelu_accurate", "gelu_fast", "relu", "relu_squared", "tanh", "linear")
# the exported head (:func:`~.hf_names.exported_head`): its Auto class and the Hub's pipeline tag
HEAD_CLASSES = {
    "masked_lm": ("AutoModelForMaskedLM", "fill-mask"),
    "classification": ("AutoModelForSequenceClassification", "text-classification"),
    "span": ("AutoModelForQuestionAnswering", "question-answering"),
}
# fairseq's pre-training task: a checkpoint of any other task is a fine-tune
PRETRAINING_TASKS = ("masked_lm",)


class ExportError(UserError, ValueError):
    """A checkpoint or data folder the export cannot represent."""


def load_checkpoint(path):
    """(model flags as a Namespace with the plugin's defaults filled in, state dict, checkpoint dict)."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    from tupe_plugin.checkpoints.checkpoint_config import saved_state
    from tupe_plugin.models.tupe_roberta import base_architecture

    state = saved_state(path)
    cfg = state.get("cfg") if isinstance(state, dict) else None
    if not cfg or "model" not in cfg or not isinstance(state.get("model"), dict):
        raise ExportError(f"{path} has no model configuration (cfg.model) and state dict: pass a checkpoint "
                          "written by fairseq-train or a tupe-* command")
    model_cfg = vars(cfg["model"]) if isinstance(cfg["model"], argparse.Namespace) else dict(cfg["model"])
    arch = model_cfg.get("arch", model_cfg.get("_name"))
    if ARCH_MODEL_NAME_REGISTRY.get(arch) != "tupe_roberta":
        raise ExportError(f"{path} is a {arch!r} model; tupe-export-hf exports the plugin's "
                          "tupe_roberta models (a --arch of tupe_plugin/models/architectures.py)")
    args = argparse.Namespace(**{key: value for key, value in model_cfg.items() if key != "_name"})
    base_architecture(args)
    return args, state["model"], state


def check_exportable(args, path):
    """The position config of ``args``; refuse, in one line naming the flag, what the exported code does
    not compute."""
    config = PositionConfig.from_args(args)
    refusals = (
        (getattr(args, "activation_fn", "gelu") not in ACTIVATIONS, "--activation-fn", args.activation_fn),
        (getattr(args, "pooler_activation_fn", "tanh") not in ACTIVATIONS, "--pooler-activation-fn",
         getattr(args, "pooler_activation_fn", None)),
        (getattr(args, "untie_weights_roberta", False), "--untie-weights-roberta", True),
        (getattr(args, "spectral_norm_classification_head", False), "--spectral-norm-classification-head",
         True),
    )
    for refused, flag, value in refusals:
        if refused:
            raise ExportError(f"{path}: {flag} {value} cannot be exported (the exported model computes "
                              f"{', '.join(ACTIVATIONS)} activations, tied LM weights, plain heads)")
    for encoding in config.encodings():
        if not encoding.exported:
            raise ExportError(f"{path}: {encoding.label} ({encoding.selection(config)}) cannot be exported: "
                              "the exported transformers code does not compute it; use the checkpoint with "
                              "fairseq")
    return config


def read_vocabulary(data_bin, rows, args):
    """fairseq's symbols in id order: <s> <pad> </s> <unk>, dict.txt's, <mask>; checked against the
    embedding's ``rows``, the dictionary fingerprint the checkpoint's ``args`` record, and the
    sentencepiece model beside it (most of the dictionary's symbols are pieces of it)."""
    import sentencepiece
    from fairseq.data import Dictionary

    from tupe_plugin.checkpoints.vocabulary import DictionaryFitError, check_dictionary_symbols
    from tupe_plugin.models.checkpoint_guards import dictionary_fingerprint

    path = os.path.join(data_bin, "dict.txt")
    model = os.path.join(data_bin, SENTENCEPIECE_MODEL)
    for name in (path, model):
        if problem := path_problem(name):
            raise ExportError(f"DATA_BIN {name}: {problem}: pass the folder with the checkpoint's dict.txt "
                              "and sentencepiece.bpe.model (the pre-training data-bin)")
    dictionary = Dictionary.load(path)
    dictionary.add_symbol("<mask>")
    if len(dictionary) != rows:
        raise ExportError(f"{path} gives {len(dictionary)} symbols (with <mask>) but the checkpoint's "
                          f"embeddings have {rows} rows: pass the DATA_BIN the checkpoint was trained with")
    fingerprint = dictionary_fingerprint(dictionary)
    recorded = getattr(args, "dictionary_fingerprint", None)
    if recorded is not None and recorded != fingerprint:
        raise ExportError(f"{path} (fingerprint {fingerprint}) is not the dictionary the checkpoint was "
                          f"trained with (fingerprint {recorded}): same size, other symbols or another "
                          "order, so the export would predict other words; pass the DATA_BIN the checkpoint "
                          "was trained with")
    try:
        processor = sentencepiece.SentencePieceProcessor(model_file=model)
    except (OSError, RuntimeError) as error:
        raise ExportError(f"DATA_BIN {model} is not a sentencepiece model ({str(error).splitlines()[0]}): "
                          "pass the DATA_BIN the checkpoint was trained with") from None
    try:
        check_dictionary_symbols(dictionary, processor, path, model, ("DATA_BIN", "DATA_BIN"))
    except DictionaryFitError as error:
        raise ExportError(str(error)) from None
    return list(dictionary.symbols)


def head_names(state_dict, requested, path):
    """{"classification": name or None, "span": name or None}: the checkpoint's heads to export; a
    ``requested`` head the checkpoint does not have is refused."""
    names, every = {}, {}
    for kind, prefix in (("classification", "classification_heads."), ("span", "span_heads.")):
        found = sorted({key[len(prefix):].split(".")[0] for key in state_dict if key.startswith(prefix)})
        every.update((name, kind) for name in found)
        if requested in found:
            found = [requested]
        if len(found) > 1:
            raise ExportError(f"{path} has the {kind} heads {', '.join(found)}: choose one with --head NAME")
        names[kind] = found[0] if found else None
    if requested is not None and requested not in every:
        held = ", ".join(f"{name} ({kind})" for name, kind in every.items()) or "none"
        raise ExportError(f"--head {requested}: {path} has no such head (its heads: {held}): give one of "
                          "them, or no --head")
    return names


def exported_tensors(state_dict, heads, path):
    """{transformers name: float32 tensor}; a tensor without a row in the name table is refused."""
    tensors, unmapped = {}, []
    for key, value in state_dict.items():
        if key == TIED[0]:
            if not torch.equal(value, state_dict[TIED[1]]):
                raise ExportError(f"{path}: {TIED[0]} differs from {TIED[1]}; the export ties them")
            continue
        name = rename(key, heads)
        if name is None:
            head = key.split(".")[1] if key.startswith(("classification_heads.", "span_heads.")) else None
            if head is not None and head not in heads.values():
                continue  # another head than the one exported
            unmapped.append(key)
        else:
            tensors[name] = value.float()
    if unmapped:
        raise ExportError(f"{path}: no place in the export for {', '.join(unmapped[:4])}"
                          + (", ..." if len(unmapped) > 4 else ""))
    return tensors


def labels(state, heads, rows):
    """id2label from the fine-tuning data's label/dict.txt (fairseq's label ids: its lines, without the
    ``madeupwordNNNN`` lines fairseq pads it with), or None."""
    if heads["classification"] is None or rows < 2:
        return None
    data = cfg_section(state, "task").get("data")
    path = os.path.join(str(data), "label", "dict.txt") if data else None
    if not path or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        names = [line.split()[0] for line in f if line.strip() and not line.startswith("madeupword")]
    return {i: name for i, name in enumerate(names)} if len(names) == rows else None


# the model options that only start a new model from a file (of the machine that trained it), before training:
# recorded as None, since the weights replace what they did
INIT_FILES = ("init_from_checkpoint", "embed_init_path", "embed_init_dict")
# task settings that name the data (a path of the machine that trained the model)
TASK_PATHS = ("data",)


def model_settings(args):
    """config.json's ``fairseq_model_args``: the model's settings of the checkpoint's flags (the options of
    the plugin's model, what its architecture sets, the dictionary it records), what the model's code reads
    and what ``tupe-convert-hf`` rebuilds it from; none of the training's, the task's or the machine's
    (data, save_dir, tensorboard_logdir, ...), and the options that start a model from a file as None."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from tupe_plugin.policies.restore_architecture import RECORDED, model_flag_actions

    names = {"arch", *model_flag_actions(), *RECORDED}
    architecture = ARCH_CONFIG_REGISTRY.get(getattr(args, "arch", None))
    if architecture is not None:
        set_by_it = argparse.Namespace()
        architecture(set_by_it)
        names.update(vars(set_by_it))
    return {key: None if key in INIT_FILES else value for key, value in sorted(vars(args).items())
            if key in names and isinstance(value, (str, int, float, bool, type(None)))}


def cfg_section(state, name):
    """The section ``name`` (``task``, ``checkpoint``, ``model``, ...) of a checkpoint's cfg as a dict; {}
    when it has none."""
    section = (state.get("cfg") or {}).get(name) or {}
    return vars(section) if isinstance(section, argparse.Namespace) else dict(section)


def task_settings(state):
    """config.json's ``fairseq_task_args``: the checkpoint's task settings (``_name`` the task; how the text
    was cut into samples, masked, ...) without the data's path, so that a checkpoint converted back by
    ``tupe-convert-hf`` validates as the original did."""
    items = cfg_section(state, "task").items()
    return {key: value for key, value in sorted(items) if key not in TASK_PATHS
            and isinstance(value, (str, int, float, bool, type(None)))
            and not (isinstance(value, str) and os.path.isabs(value))}


def model_fields(args, vocabulary):
    """config.json's fields of the remote-code model that its flags ``args`` give (sizes, activations,
    dropouts, normalisation, the position flags): what the exported code builds the model from."""
    return dict(
        vocab_size=len(vocabulary), hidden_size=args.encoder_embed_dim,
        num_hidden_layers=args.encoder_layers, num_attention_heads=args.encoder_attention_heads,
        intermediate_size=args.encoder_ffn_embed_dim, max_position_embeddings=args.max_positions,
        hidden_act=args.activation_fn, pooler_activation=args.pooler_activation_fn,
        hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.attention_dropout,
        activation_dropout=args.activation_dropout, classifier_dropout=args.pooler_dropout,
        layer_norm_eps=value_in_use("layer_norm_eps", args.layer_norm_eps),
        pre_layer_norm=bool(args.encoder_normalize_before),
        embedding_layer_norm=bool(args.layernorm_embedding),
        **{flag: getattr(args, flag) for flag in POSITION_FLAGS},
    )


def hf_config(args, state, tensors, heads, vocabulary, fast):
    """config.json: the model's sizes and flags, its heads and labels; ``fast``: the tokenizer is
    tokenizer.json (else transformers' ``auto_map`` names the custom one)."""
    config = dict(
        model_type=EXPORT_MODEL_TYPE, architectures=["TupeForMaskedLM"],
        auto_map=AUTO_MAP if fast else dict(AUTO_MAP, **TOKENIZER_AUTO_MAP), **model_fields(args, vocabulary),
        pad_token_id=1, bos_token_id=0, eos_token_id=2, tie_word_embeddings=True,
        fairseq_model_args=model_settings(args), fairseq_task_args=task_settings(state),
        fairseq_head_names=heads,
    )
    return dict(config, **head_fields(state, tensors, heads))


def native_config(native, args, position, state, tensors, heads, vocabulary, kept):
    """config.json of a native export: the transformers class's fields, its heads and labels, and what
    ``tupe-convert-hf`` rebuilds the plugin model from (the model flags, the heads' names, the ``kept``
    tensors the weights do not hold, as lists)."""
    config = dict(native.config(args, vocabulary, position), architectures=native.architecture(heads),
                  fairseq_model_args=model_settings(args), fairseq_task_args=task_settings(state),
                  fairseq_head_names=heads,
                  fairseq_tensors={key: value.tolist() for key, value in kept.items()})
    return dict(config, **head_fields(state, tensors, heads))


def head_fields(state, tensors, heads):
    """config.json's fields of the exported classification head: its number of labels, the problem type,
    the labels' names."""
    config = {}
    if heads["classification"] is not None:
        rows = tensors["classifier.out_proj.weight"].size(0)
        config["num_labels"] = rows
        config["problem_type"] = "regression" if rows == 1 else "single_label_classification"
        id2label = labels(state, heads, rows)
        if id2label:
            config["id2label"] = id2label
            config["label2id"] = {name: i for i, name in id2label.items()}
    return config


def updates_and_data(state):
    """``(updates, data folder name)`` a checkpoint records (its optimizer history's ``num_updates``, the
    name of its task's ``data``); each None where it records none."""
    updates = (state.get("optimizer_history") or [{}])[-1].get("num_updates")
    data = cfg_section(state, "task").get("data")
    return updates, os.path.basename(os.path.normpath(str(data))) if data else None


def training_text(updates, data):
    """``N updates on `DATA``` of :func:`updates_and_data`."""
    return (f"{updates} updates" if updates is not None else "an unknown number of updates") \
        + (f" on `{data}`" if data else "")


def is_fine_tune(state):
    """Whether the checkpoint ``state`` was trained on another fairseq task than the pre-training's
    (``sentence_prediction``, ``squad_span``, ...)."""
    return cfg_section(state, "task").get("_name") not in (None, *PRETRAINING_TASKS)


def run_folder(state, checkpoint):
    """The folder the training run of ``state`` ran in, which the relative paths it records are relative to:
    the one its ``--save-dir``, recorded relative to it, leads from to the folder of the file ``checkpoint``
    (still where the run wrote it); None otherwise."""
    save_dir = cfg_section(state, "checkpoint").get("save_dir")
    if not save_dir or os.path.isabs(str(save_dir)):
        return None
    folder, tail = os.path.dirname(os.path.abspath(checkpoint)), os.path.normpath(str(save_dir))
    if tail == os.curdir:
        return folder
    if tail.startswith(os.pardir) or not folder.endswith(os.sep + tail):
        return None
    return folder[:-len(tail) - 1] or os.sep


def run_start(state, checkpoint):
    """The checkpoint file the training run of ``state`` (the file ``checkpoint``) started from, as the run
    recorded it: fairseq's ``--finetune-from-model`` (what ``tupe-finetune-glue`` and ``tupe-finetune-squad``
    pass, an absolute path), a ``--restore-file`` other than fairseq's default (the run's own
    ``checkpoint_last.pt``), the plugin's ``--init-from-checkpoint``; a path relative to the folder the run
    ran in made absolute where that folder is known (:func:`run_folder`); None when it records none."""
    from tupe_plugin.policies.missing_restore_file import DEFAULT_RESTORE_FILE

    restore = cfg_section(state, "checkpoint").get("restore_file")
    for path in (cfg_section(state, "checkpoint").get("finetune_from_model"),
                 None if restore == DEFAULT_RESTORE_FILE else restore,
                 cfg_section(state, "model").get("init_from_checkpoint")):
        if path:
            folder = None if os.path.isabs(str(path)) else run_folder(state, checkpoint)
            return os.path.join(folder, str(path)) if folder else str(path)
    return None


def pretraining(state, checkpoint):
    """The card's words on the pre-training of the checkpoint ``state`` (the file ``checkpoint``): the
    updates and data it records; for a fine-tune, which records its own, those that the checkpoint its run
    started from (:func:`run_start`) records, read weights-only (:func:`saved_state`) and followed through a
    fine-tune of a fine-tune; "unknown", and why, when that file is not there or cannot be read."""
    from tupe_plugin.checkpoints.checkpoint_config import saved_state

    read, source = {os.path.realpath(checkpoint)}, None
    while is_fine_tune(state):
        start = run_start(state, checkpoint)
        if start is None:
            return "unknown (the fine-tuning records no checkpoint it started from)"
        name = f"`{os.path.basename(start)}`, the checkpoint the fine-tuning started from,"
        if not os.path.isabs(start):
            return (f"unknown ({name} is recorded relative to the folder the fine-tuning ran in, which is "
                    "unknown: the checkpoint does not lie in a --save-dir recorded relative to it)")
        if not os.path.isfile(start):
            return f"unknown ({name} is no longer at the path the fine-tuning recorded)"
        if os.path.realpath(start) in read:
            return f"unknown ({name} is the exported checkpoint or one already followed, overwritten since)"
        try:
            state = saved_state(start)
        except (UserError, OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as error:
            logger.warning("model card: %s, the checkpoint the fine-tuning started from, cannot be read "
                           "(%s): the card says the pre-training is unknown", start,
                           str(error).split("\n")[0])
            return f"unknown ({name} cannot be read)"
        read.add(os.path.realpath(start))
        source, checkpoint = name, start
    return training_text(*updates_and_data(state)) + (" (as the checkpoint records them)" if source is None
                                                      else f" (as {source} records them)")


def task_name(state, checkpoint):
    """The name of the fine-tuning task of ``state`` (the file ``checkpoint``): the ``task`` of the
    ``run.json`` that ``tupe-finetune-glue`` and ``tupe-finetune-squad`` write beside it (``RTE``, ``SQuAD
    v1.1``; when it records the start the checkpoint records), else the GLUE task the data folder is named
    after as ``tupe-finetune-glue`` names it (``TASK-bin``), else None."""
    from tupe_plugin.downstream.run_record import read_record
    from tupe_plugin.glue.tasks import GLUE_TASKS

    try:
        record = read_record(os.path.dirname(os.path.abspath(checkpoint)))
    except (OSError, ValueError):
        record = None
    start = run_start(state, checkpoint)
    if isinstance(record, dict) and record.get("task") and start and record.get("checkpoint") \
            and os.path.realpath(str(record["checkpoint"])) == os.path.realpath(start):
        return str(record["task"])
    _, data = updates_and_data(state)
    stem = data.removesuffix("-bin") if data else None
    return stem if stem in GLUE_TASKS else None


def dev_score(state):
    """The card's line on the dev score the fine-tuning recorded: fairseq's ``extra_state["val_loss"]``, the
    checkpoint's score of ``--best-checkpoint-metric`` at its validation, and ``extra_state["best"]``, the
    run's best until then."""
    checkpoint = cfg_section(state, "checkpoint")
    metric = checkpoint.get("best_checkpoint_metric") or "loss"
    extra = state.get("extra_state") or {}
    try:
        score = float(extra["val_loss"])
    except (KeyError, TypeError, ValueError):
        return f"- dev {metric}: not recorded (the checkpoint holds no validation score)"
    better = "higher" if checkpoint.get("maximize_best_checkpoint_metric") else "lower"
    line = (f"- dev {metric}: {score:.4g} (this checkpoint's, as the fine-tuning's validation recorded it; "
            f"fairseq's `--best-checkpoint-metric {metric}`, {better} is better)")
    try:
        best = float(extra["best"])
    except (KeyError, TypeError, ValueError):
        return line
    return line if best == score else line[:-1] + f"; the run's best until then: {best:.4g})"


def official_squad_scores(state, checkpoint):
    """The card's line on SQuAD's official dev EM/F1 of ``checkpoint``, where ``tupe-finetune-squad``
    evaluated this very file (its ``checkpoint_best.pt``, the scores logged after it was written); [] where
    it did not."""
    from tupe_plugin.squad.finetune import EVALUATED_CHECKPOINT, EVALUATION_LOG, official_scores

    folder = os.path.dirname(os.path.abspath(checkpoint))
    log = os.path.join(folder, EVALUATION_LOG)
    evaluated = os.path.basename(checkpoint) == EVALUATED_CHECKPOINT and os.path.isfile(log) \
        and os.path.getmtime(log) >= os.path.getmtime(checkpoint)
    if cfg_section(state, "task").get("_name") != "squad_span" or not evaluated:
        return []
    scores = official_scores(folder)
    if scores is None:
        return []
    return [f"- dev EM {scores[0]:.2f}, F1 {scores[1]:.2f} (SQuAD's official evaluation of this checkpoint "
            f"by `tupe-finetune-squad`, its `{EVALUATION_LOG}`)"]


def labels_line(config):
    """The card's line on the exported classification head's labels (``id2label``); [] without one."""
    if "num_labels" not in config:
        return []
    if config["problem_type"] == "regression":
        return ["- labels: none, a regression head (one output)"]
    if config.get("id2label"):
        return ["- labels: " + ", ".join(f"{i} `{name}`" for i, name in config["id2label"].items())
                + " (`id2label`, from the data's `label/dict.txt`)"]
    return [f"- labels: {config['num_labels']} classes, unnamed (the checkpoint's data holds no "
            f"`label/dict.txt` of {config['num_labels']} names)"]


def hub_header(config, position, native):
    """The Hugging Face Hub's YAML header of the card: ``library_name``, ``pipeline_tag`` (the exported
    head's, :data:`HEAD_CLASSES`), ``tags`` (fairseq, tupe-plugin, the position encodings' registry names,
    the transformers model type of a native export). No ``license``: neither a checkpoint nor its data
    records one, and the export invents none."""
    tags = ["fairseq", "tupe-plugin", *(encoding.name.replace("_", "-") for encoding in position.encodings())]
    tags += [native.model_type] if native is not None else []
    header = dict(library_name="transformers",
                  pipeline_tag=HEAD_CLASSES[exported_head(config.get("fairseq_head_names") or {})][1],
                  tags=tags)
    return ["---", yaml.safe_dump(header, sort_keys=False).rstrip("\n"), "---", ""]


def model_card(args, state, config, position, checkpoint, slow_reason, native, why_remote):
    """README.md of the export: the Hub's YAML header (:func:`hub_header`), architecture, encoding and
    papers, sizes, the pre-training (:func:`pretraining`), a fine-tune's task, labels and dev score, which
    kind of export it is and why, how it is loaded; file and folder names only, never this machine's
    paths. ``position``: the checkpoint's :class:`~tupe_plugin.encodings.position_config.PositionConfig`;
    ``slow_reason``: why the tokenizer is the custom one, or None for tokenizer.json; ``native``: the
    :class:`~.hf_native.NativeClass` it is exported as, or None with ``why_remote``."""
    flags = vars(args)
    encodings = [f"{flag_name(flag)} {flags[flag]}" for flag in (*registry.FAMILIES, "cls_reset")]
    encodings += [flag_name(name) + ("" if flags[name] is True else f" {flags[name]}")
                  for encoding in position.encodings() for name in encoding.option_names()
                  if flags[name] is not False]
    papers = sorted({f"{encoding.citation} ({encoding.label})" for encoding in position.encodings()})
    tokenizer_class, tokenizer_code = tokenizer_loader(native is not None, slow_reason is None)
    auto_class = auto_class_of(config)
    if native is not None:
        kind = [f"- export: transformers' own {native.name} (`{config['architectures'][0]}`, model type "
                f"`{native.model_type}`): {native.name} computes this model's outputs, so it loads without "
                "remote code"]
        kind += [f"- note: {note}" for note in native.notes(args, position)]
        load = ["Load it with transformers (no remote code):"]
        model_code = ""
    else:
        kind = [f"- export: the plugin's remote-code model (`{CODE_FILES[1]}`): {why_remote}"]
        load = ["Load it with transformers (the model's code is in this folder: `trust_remote_code=True`):"]
        model_code = ", trust_remote_code=True"
    fine_tuned, task = is_fine_tune(state), cfg_section(state, "task").get("_name")
    name = task_name(state, checkpoint) if fine_tuned else None
    training = [f"- pre-training: {pretraining(state, checkpoint)}"]
    if fine_tuned:
        training.append(f"- fine-tuning: {name or 'a task it does not name'} (fairseq's `{task}` task), "
                        f"{training_text(*updates_and_data(state))} (as the checkpoint records them)")
    training += labels_line(config)
    training += [dev_score(state), *official_squad_scores(state, checkpoint)] if fine_tuned else []
    subject = name or f"fairseq's `{task}` task"
    fine_tuned_on = f" and fine-tuned on {subject}" if fine_tuned else ""
    lines = [
        *hub_header(config, position, native),
        f"# {getattr(args, 'arch', 'tupe_roberta')}", "",
        f"A BERT-style encoder pre-trained with the tupe-plugin for fairseq{fine_tuned_on}, exported by "
        "`tupe-export-hf`.",
        "",
        f"- architecture: `{getattr(args, 'arch', 'tupe_roberta')}`; {config['num_hidden_layers']} layers, "
        f"hidden size {config['hidden_size']}, {config['num_attention_heads']} heads, FFN "
        f"{config['intermediate_size']}, {config['vocab_size']} tokens, {args.max_positions} positions",
        f"- position encoding: {', '.join(encodings)}",
        *(f"- paper: {paper}" for paper in papers),
        *training,
        f"- exported from `{os.path.basename(checkpoint)}`",
        *kind,
        "- tokenizer: " + ("`tokenizer.json` (a standard fast tokenizer with the model's ids)"
                           if slow_reason is None else
                           f"the custom sentencepiece tokenizer of `{TOKENIZER_CODE}`: a tokenizer.json "
                           f"cannot give the model's ids ({slow_reason})"),
        "", *load, "",
        "```python",
        f"from transformers import {auto_class}, {tokenizer_class}",
        f"tokenizer = {tokenizer_class}.from_pretrained(FOLDER{tokenizer_code})",
        f"model = {auto_class}.from_pretrained(FOLDER{model_code})",
        "```", "",
    ]
    return "\n".join(lines)


def tokenizer_loader(native, fast):
    """(class, arguments) of the card's tokenizer line, the one that loads it without asking to run code
    where none is needed: ``AutoTokenizer`` for a native export; for the remote-code model's
    ``tokenizer.json``, ``PreTrainedTokenizerFast``, since ``AutoTokenizer`` (transformers 5) reads
    ``config.json`` through ``AutoConfig`` first, whose model type only the folder's code knows, and asks
    whether to run it; the custom sentencepiece tokenizer is code (``trust_remote_code=True``)."""
    if not fast:
        return "AutoTokenizer", ", trust_remote_code=True"
    return ("AutoTokenizer" if native else "PreTrainedTokenizerFast"), ""


def auto_class_of(config):
    """The Auto class of the exported head (:func:`~.hf_names.exported_head`): a classifier's, a span
    head's, or (with both, or none) the masked LM's."""
    return HEAD_CLASSES[exported_head(config.get("fairseq_head_names") or {})][0]


def is_export(folder):
    """Whether ``folder`` is a previous export (its config.json names the model type ``tupe``, or records
    the plugin's model flags as a native export's does)."""
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        return config.get("model_type") == EXPORT_MODEL_TYPE or "fairseq_model_args" in config
    except (OSError, ValueError, AttributeError):
        return False


def check_output(out, force, inputs):
    """Refuse an ``out`` the export may not replace: a link or a file, a folder that is, holds or lies inside
    one of ``inputs`` ((name, path) pairs), a non-empty folder without ``force`` or, with it, one that is no
    previous export or holds anything an export does not write (the user's notes: replacing the folder whole
    would remove them)."""
    if os.path.islink(out):
        raise ExportError(f"--out {out} is a symbolic link: give the folder itself (the export replaces "
                          "--out whole)")
    if os.path.lexists(out) and not os.path.isdir(out):
        raise ExportError(f"--out {out}: {path_problem(out, 'folder')}: give a new folder")
    if meeting := folder_meeting_input(out, inputs):
        raise ExportError(f"--out {out} {meeting}, which the export would replace (--force or not): give "
                          "another --out")
    if os.path.isdir(out) and os.listdir(out):
        if not force:
            raise ExportError(f"--out {out} is not empty; nothing is overwritten: choose another --out, or "
                              "add --force to replace a previous export once the export has succeeded")
        if not is_export(out):
            raise ExportError(f"--out {out} holds files but no previous export (no config.json of a tupe "
                              "model): --force replaces only a previous export; choose another --out")
        if others := sorted(set(os.listdir(out)) - EXPORT_FILES):
            shown = ", ".join(name + ("/" if os.path.isdir(os.path.join(out, name)) else "")
                              for name in others)
            raise ExportError(f"--out {out} holds a previous export and {shown}, which an export does not "
                              "write: --force replaces only the export's files; move them out of --out or "
                              "choose another --out")


def sibling_folder(out):
    """The folder the export is written into before it is moved to ``out``; refused when ``out``'s parent
    does not take it."""
    try:
        return make_sibling_folder(out)
    except OSError as error:
        raise ExportError(f"--out {out}: cannot write beside it in {os.path.dirname(out)} "
                          f"({error.strerror}): give a folder you can write") from None


def export(checkpoint, data_bin, out, head=None, force=False, remote_code=False):
    """Write the transformers folder ``out`` of ``checkpoint``; return ``out``. Every input is checked
    before anything is written. The model is written as transformers' own class where one computes it
    (:mod:`.hf_native`), else, or with ``remote_code``, as the remote-code model."""
    out = os.path.abspath(out)
    for name, path, expected in (("CKPT", checkpoint, "file"), ("DATA_BIN", data_bin, "folder")):
        if problem := path_problem(path, expected):
            raise ExportError(f"{name} {path}: {problem}")
    inputs = [("CKPT", checkpoint), ("DATA_BIN", data_bin)]
    check_output(out, force, inputs)
    require("tokenizers", "export", "tupe-export-hf")
    args, state_dict, state = load_checkpoint(checkpoint)
    task_data = (state.get("cfg") or {}).get("task", {}).get("data")
    check_output(out, force, [("the checkpoint's data", str(task_data) if task_data else None)])
    position = check_exportable(args, checkpoint)
    rows = state_dict["encoder.sentence_encoder.embed_tokens.weight"].size(0)
    vocabulary = read_vocabulary(data_bin, rows, args)
    heads = head_names(state_dict, head, checkpoint)
    if exported_head(heads) != "masked_lm":  # a classifier's or span head's: its class reads no LM head
        state_dict = {key: value for key, value in state_dict.items() if not key.startswith(LM_HEAD)}
    tensors = exported_tensors(state_dict, heads, checkpoint)
    fast, slow_reason = hf_tokenizer.fast_tokenizer(os.path.join(data_bin, SENTENCEPIECE_MODEL), vocabulary)
    if slow_reason is not None:
        logger.warning("tokenizer: a tokenizer.json cannot give the model's ids (%s); the export keeps the "
                       "custom sentencepiece tokenizer: load it with AutoTokenizer.from_pretrained(DIR, "
                       "trust_remote_code=True)", slow_reason)
    if remote_code:
        native, why_remote = None, "asked for with --remote-code"
    else:
        native, why_remote = hf_native.native_class(args, position, heads, tensors)
        if native is None:
            logger.warning("exported as the remote-code model (load it with trust_remote_code=True), not as "
                           "a transformers class: %s", why_remote)
    if native is None:
        config = hf_config(args, state, tensors, heads, vocabulary, fast is not None)
    else:
        native_tensors, kept = native.tensors(state_dict, args, position, heads)
        config = native_config(native, args, position, state, tensors, heads, vocabulary, kept)
        tensors = {name: value.float() for name, value in native_tensors.items()}
    folder = sibling_folder(out)
    try:
        write_safetensors(os.path.join(folder, "model.safetensors"), tensors)
        with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, sort_keys=True)
        if fast is not None:
            fast.save(os.path.join(folder, "tokenizer.json"))
            tokenizer_config = hf_tokenizer.tokenizer_config(args.max_positions)
        else:
            shutil.copyfile(os.path.join(REMOTE_CODE, TOKENIZER_CODE), os.path.join(folder, TOKENIZER_CODE))
            tokenizer_config = {"tokenizer_class": "TupeTokenizer", "auto_map": TOKENIZER_AUTO_MAP,
                                "model_max_length": args.max_positions}
        with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(tokenizer_config, f, indent=2)
        with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8") as f:
            f.writelines(symbol + "\n" for symbol in vocabulary)
        shutil.copyfile(os.path.join(data_bin, SENTENCEPIECE_MODEL),
                        os.path.join(folder, SENTENCEPIECE_MODEL))
        for name in CODE_FILES if native is None else ():
            shutil.copyfile(os.path.join(REMOTE_CODE, name), os.path.join(folder, name))
        with open(os.path.join(folder, "README.md"), "w", encoding="utf-8") as f:
            f.write(model_card(args, state, config, position, checkpoint, slow_reason, native, why_remote))
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.rename(folder, out)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    logger.info("wrote %s (%s as %s, %d tensors%s)", out, getattr(args, "arch", "?"),
                "the remote-code model" if native is None else native.architecture(heads)[0], len(tensors),
                "".join(f", {kind} head {name}" for kind, name in heads.items() if name))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", metavar="CKPT",
                        help="the plugin checkpoint (model.pt, checkpoint_best.pt)")
    parser.add_argument("data_bin", metavar="DATA_BIN",
                        help="the folder with the checkpoint's dict.txt and sentencepiece.bpe.model")
    parser.add_argument("--out", required=True, help="the folder to write (from_pretrained loads it)")
    parser.add_argument("--head", help="the classification or span head to export when the checkpoint has "
                        "several")
    parser.add_argument("--force", action="store_true",
                        help="replace a previous export in --out once the export succeeded")
    parser.add_argument("--remote-code", action="store_true",
                        help="write the remote-code model (trust_remote_code=True) even where transformers "
                        "has the model's class (RoBERTa, RoFormer, DeBERTa-v2): one loader for all exports")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
    try:
        out = export(args.checkpoint, args.data_bin, args.out, args.head, args.force, args.remote_code)
    except (UserError, MissingExtraError) as error:
        sys.exit(f"tupe-export-hf: error: {error}")
    with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    remote = ", trust_remote_code=True" if config["model_type"] == EXPORT_MODEL_TYPE else ""
    print(f"tupe-export-hf: done\n"
          f"output folder: {out} (model.safetensors, config.json, the tokenizer, README.md: the model card)\n"
          f"load it with:  {auto_class_of(config)}.from_pretrained({out!r}{remote})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
