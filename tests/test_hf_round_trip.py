"""The way back from Hugging Face, end to end: a checkpoint pre-trained with fairseq-train on real text with
task settings other than fairseq's defaults (whole lines per block, another masking probability and seed),
exported with tupe-export-hf (the remote-code model, and transformers' RoBERTa, RoFormer and DeBERTa-v2),
converted back with tupe-convert-hf, validates with docs/export-hf.md's fairseq-validate command to the
original's loss on as many blocks."""
# the fixtures imported from the other test modules are the tests' arguments
# ruff: noqa: F811

import json
import re
import shutil

import pytest
import sentencepiece as spm
import torch
from cli import run_fairseq_steps, train_args
from conftest import test_data
from test_hf_export import whole_data_bin  # noqa: F401

from tupe_plugin.conversion import hf_cli, hf_export

# form -> (the architecture pre-trained, the model_type its export is)
FORMS = {
    "remote code (TUPE-R)": ("tupe_r_tiny", "tupe"),
    "RoBERTa (BERT-A)": ("bert_a_tiny", "roberta"),
    "RoFormer (BERT-RoPE)": ("bert_rope_tiny", "roformer"),
    "DeBERTa-v2": ("deberta_tiny", "deberta-v2"),
}
# the pre-training's task settings, none of them fairseq's default (none, 0.15, 1): a checkpoint that
# recorded the defaults validates on other blocks (sample_break_mode), other masked tokens (mask_prob, the
# seed the masking is drawn with) and to another loss
PRE_TRAINING = ["--sample-break-mode", "complete", "--mask-prob", "0.25", "--seed", "7"]
BLOCK = 64


def validate_command(data, checkpoint):
    """docs/export-hf.md's fairseq-validate command (docs/pretraining.md's, of any checkpoint)."""
    return ("validate", [data, "--user-dir", "tupe_plugin", "--path", checkpoint, "--task", "masked_lm",
                         "--batch-size", 16])


def sentences(processor):
    """The WikiText-2 lines cut at their full stops, in sentencepiece pieces, those that fit a block."""
    with open(test_data("wikitext-2", "wiki.valid.head.tokens"), encoding="utf-8") as f:
        text = [sentence.strip() + " ." for line in f for sentence in line.split(" . ") if sentence.strip()]
    encoded = (" ".join(processor.encode(sentence, out_type=str)) for sentence in text)
    return [pieces for pieces in encoded if len(pieces.split()) < BLOCK - 2]


@pytest.fixture(scope="module")
def round_trip(whole_data_bin, tmp_path_factory):
    """Every form pre-trained (fairseq-train, 2 updates), exported (tupe-export-hf), converted back
    (tupe-convert-hf), and the original and the converted checkpoint validated with the same command:
    {form: (the export's folder, the original checkpoint, the converted one, their fairseq-validate
    outputs)}."""
    root = tmp_path_factory.mktemp("round_trip")
    lines = sentences(spm.SentencePieceProcessor(model_file=str(whole_data_bin / "sentencepiece.bpe.model")))
    (root / "train.bpe").write_text("\n".join(lines[:-80]) + "\n", encoding="utf-8")
    (root / "valid.bpe").write_text("\n".join(lines[-80:]) + "\n", encoding="utf-8")
    data = root / "data-bin"
    run_fairseq_steps(
        ("preprocess", ["--only-source", "--trainpref", root / "train.bpe", "--validpref", root / "valid.bpe",
                        "--srcdict", whole_data_bin / "dict.txt", "--destdir", data, "--workers", 1]),
        *[("train", train_args(data, root / arch, arch, 2, *PRE_TRAINING, "--disable-validation"))
          for arch, _ in FORMS.values()])
    shutil.copy(whole_data_bin / "sentencepiece.bpe.model", data / "sentencepiece.bpe.model")
    paths = {}
    for form, (arch, _) in FORMS.items():
        run = root / arch
        original, exported, back = run / "checkpoint_last.pt", run / "hf", run / "back"
        assert hf_export.main([str(original), str(data), "--out", str(exported)]) == 0
        assert hf_cli.main(["--hf-model", str(exported), "--out", str(back)]) == 0
        paths[form] = (exported, original, back / "model.pt")
    outputs = iter(run_fairseq_steps(*[validate_command(data, checkpoint) for exported, *checkpoints
                                       in paths.values() for checkpoint in checkpoints]))
    return {form: (*form_paths, next(outputs), next(outputs)) for form, form_paths in paths.items()}


def blocks(output):
    """The number of blocks fairseq-validate read (masked_lm's "loaded N blocks" line)."""
    return [int(count) for count in re.findall(r"loaded (\d+) blocks from", output)]


def loss_and_perplexity(output):
    """fairseq-validate's loss (in bits, printed to 3 decimals) and perplexity (2 ** the unrounded loss,
    printed to 2 decimals: near 200, two equal perplexities are losses within 1e-4 bits)."""
    (found,) = re.findall(r"valid on 'valid' subset \| loss ([0-9.]+) \| ppl ([0-9.]+)", output)
    return tuple(map(float, found))


def cfg(path):
    return torch.load(path, weights_only=False)["cfg"]


@pytest.mark.parametrize("form", FORMS)
def test_each_form_is_exported_as_its_class(round_trip, form):
    exported, *_ = round_trip[form]
    assert json.loads((exported / "config.json").read_text())["model_type"] == FORMS[form][1]


@pytest.mark.parametrize("form", FORMS)
def test_a_converted_checkpoint_records_the_pre_trainings_task_settings_and_seed(round_trip, form):
    _, original, back, *_ = round_trip[form]
    original, back = cfg(original), cfg(back)
    for key in ("sample_break_mode", "tokens_per_sample", "mask_prob", "leave_unmasked_prob", "seed"):
        assert back["task"][key] == original["task"][key], key
    assert (back["task"]["sample_break_mode"], back["task"]["mask_prob"]) == ("complete", 0.25)
    assert back["common"]["seed"] == back["task"]["seed"] == original["common"]["seed"] == 7


@pytest.mark.parametrize("form", FORMS)
def test_a_converted_checkpoint_names_its_own_folder_as_its_data(round_trip, form):
    _, _, back, *_ = round_trip[form]
    saved = cfg(back)
    assert saved["task"]["data"] == vars(saved["model"])["data"] == str(back.parent)


@pytest.mark.parametrize("form", FORMS)
def test_a_converted_checkpoint_validates_on_the_originals_blocks(round_trip, form):
    *_, original, back = round_trip[form]
    (count,) = blocks(original)
    assert blocks(back) == [count] and count > 1


@pytest.mark.parametrize("form", FORMS)
def test_a_converted_checkpoint_validates_to_the_originals_loss(round_trip, form):
    *_, original, back = round_trip[form]
    loss, perplexity = loss_and_perplexity(original)
    assert loss_and_perplexity(back) == (loss, perplexity) and 0 < loss < 100
