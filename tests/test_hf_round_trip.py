"""The way back from Hugging Face, end to end: a checkpoint pre-trained with fairseq-train on real text with
task settings other than fairseq's defaults (whole lines per block, another masking probability and seed),
exported with tupe-export-hf (the remote-code model, and transformers' RoBERTa, RoFormer and DeBERTa-v2),
converted back with tupe-convert-hf, records those settings and validates with docs/export-hf.md's
fairseq-validate command to the original's loss on as many blocks (one form of each export class). The
fairseq-trained export of every native family (BERT-A, no PE, the two sinusoid APEs as RoBERTa, BERT-RoPE
as RoFormer, DeBERTa as DeBERTa-v2) loads with plain from_pretrained, no trust_remote_code, in a process
that can import torch and transformers only, as transformers' own class, and gives the plugin's masked-LM
logits on a padded batch of real text."""
# the fixtures imported from the other test modules are the tests' arguments
# ruff: noqa: F811

import json
import re
import shutil

import pytest
import sentencepiece as spm
import torch
from cli import run_fairseq_steps, train_args
from conftest import PRESETS, native_type, test_data
from test_hf_export import plugin_batch, transformers_only, whole_data_bin  # noqa: F401
from test_hf_native_export import assert_real_positions_close, plugin_model

from tupe_plugin.conversion import hf_cli, hf_export

# the native forms: model_type -> transformers' own masked-LM class
MASKED_LM_CLASSES = {"roberta": "RobertaForMaskedLM", "roformer": "RoFormerForMaskedLM",
                     "deberta-v2": "DebertaV2ForMaskedLM"}
# form -> (the architecture pre-trained, the model_type its export is): the remote-code model (TUPE-R), then
# every preset its encodings' hf_native export as transformers' own class
NATIVE = [preset for preset in PRESETS if native_type(preset) is not None]
FORMS = {"remote code (tupe_r)": ("tupe_r_tiny", "tupe"),
         **{preset: (f"{preset}_tiny", native_type(preset)) for preset in NATIVE}}
# validated with fairseq-validate, the first form of each export class (each fairseq-validate costs seconds:
# its data loader's worker process)
VALIDATED = [form for form, (_, model_type) in FORMS.items()
             if form == next(first for first, (_, its_type) in FORMS.items() if its_type == model_type)]
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
def trained(whole_data_bin, tmp_path_factory):
    """Every form pre-trained (fairseq-train, 2 updates, all in one process), exported (tupe-export-hf) and
    converted back (tupe-convert-hf): (the data-bin, {form: (the export's folder, the original checkpoint,
    the converted one)})."""
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
    return data, paths


@pytest.fixture(scope="module")
def round_trip(trained):
    """The original and the converted checkpoint of each VALIDATED form validated with the same command, in
    one process: {form: (the original's fairseq-validate output, the converted one's)}."""
    data, paths = trained
    outputs = iter(run_fairseq_steps(*[validate_command(data, checkpoint) for form in VALIDATED
                                       for checkpoint in paths[form][1:]]))
    return {form: (next(outputs), next(outputs)) for form in VALIDATED}


CHILD = r"""
import sys, json, torch
sys.modules["fairseq"] = None
sys.modules["tupe_plugin"] = None
from transformers import AutoModelForMaskedLM
request = json.load(open(sys.argv[1]))
batch = torch.load(request["batch"])
ids, mask = batch["input_ids"], batch["attention_mask"]
results = {}
with torch.no_grad():
    for form, folder in request["exports"].items():
        model = AutoModelForMaskedLM.from_pretrained(folder).eval()
        results[form] = dict(module=type(model).__module__, name=type(model).__name__,
                             logits=model(input_ids=ids, attention_mask=mask).logits)
torch.save(results, request["out"])
"""


@pytest.fixture(scope="module")
def transformers_logits(trained, tmp_path_factory):
    """The native exports loaded with plain from_pretrained (no trust_remote_code) in one process that can
    import torch and transformers only: (the padded batch of real text, {form: the class loaded, its
    masked-LM logits})."""
    data, paths = trained
    root = tmp_path_factory.mktemp("trained_logits")
    batch, _, _ = plugin_batch(data, paths[NATIVE[0]][1])
    # TEXTS cut to the models' --max-positions (the blocks they were trained on): the longest row fills it
    positions = cfg(paths[NATIVE[0]][1])["model"].max_positions
    batch = {key: value[:, :positions] for key, value in batch.items()}
    batch["input_ids"] = batch["input_ids"].masked_fill(batch["attention_mask"].eq(0), 1)  # <pad>
    torch.save(batch, root / "batch.pt")
    request = dict(exports={form: str(paths[form][0]) for form in NATIVE}, batch=str(root / "batch.pt"),
                   out=str(root / "results.pt"))
    (root / "request.json").write_text(json.dumps(request))
    transformers_only(CHILD, root / "request.json", modules=root / "modules")
    return batch, torch.load(root / "results.pt", weights_only=False)


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
def test_each_form_is_exported_as_its_class(trained, form):
    exported, *_ = trained[1][form]
    assert json.loads((exported / "config.json").read_text())["model_type"] == FORMS[form][1]


@pytest.mark.parametrize("form", FORMS)
def test_a_converted_checkpoint_records_the_pre_trainings_task_settings_and_seed(trained, form):
    _, original, back = trained[1][form]
    original, back = cfg(original), cfg(back)
    for key in ("sample_break_mode", "tokens_per_sample", "mask_prob", "leave_unmasked_prob", "seed"):
        assert back["task"][key] == original["task"][key], key
    assert (back["task"]["sample_break_mode"], back["task"]["mask_prob"]) == ("complete", 0.25)
    assert back["common"]["seed"] == back["task"]["seed"] == original["common"]["seed"] == 7


@pytest.mark.parametrize("form", FORMS)
def test_a_converted_checkpoint_names_its_own_folder_as_its_data(trained, form):
    _, _, back = trained[1][form]
    saved = cfg(back)
    assert saved["task"]["data"] == vars(saved["model"])["data"] == str(back.parent)


@pytest.mark.slow  # eight fairseq-validate runs, 45 s: make test-slow
@pytest.mark.parametrize("form", VALIDATED)
def test_a_converted_checkpoint_validates_on_the_originals_blocks(round_trip, form):
    original, back = round_trip[form]
    (count,) = blocks(original)
    assert blocks(back) == [count] and count > 1


@pytest.mark.slow  # eight fairseq-validate runs, 45 s: make test-slow
@pytest.mark.parametrize("form", VALIDATED)
def test_a_converted_checkpoint_validates_to_the_originals_loss(round_trip, form):
    original, back = round_trip[form]
    loss, perplexity = loss_and_perplexity(original)
    assert loss_and_perplexity(back) == (loss, perplexity) and 0 < loss < 100


@pytest.mark.parametrize("form", NATIVE)
def test_a_fairseq_trained_native_export_gives_the_plugins_masked_lm_logits_without_remote_code(
        trained, transformers_logits, form):
    data, paths = trained
    batch, results = transformers_logits
    _, original, _ = paths[form]
    assert (results[form]["module"].split(".")[:2], results[form]["name"]) == \
        (["transformers", "models"], MASKED_LM_CLASSES[FORMS[form][1]])
    assert batch["attention_mask"].eq(0).any() and batch["attention_mask"].all(1).any()
    with torch.no_grad():
        logits = plugin_model(original, data)(batch["input_ids"])[0]
    assert_real_positions_close(results[form]["logits"], logits, batch["attention_mask"], "logits")
