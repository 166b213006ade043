"""tupe-export-hf: tiny random-weight plugin checkpoints of every exportable family, exported, loaded through
transformers' Auto classes in a child process that cannot import fairseq or tupe_plugin, and compared with
the plugin (masked-LM logits, features, heads; padded batch of real text; FIRE's rows alone); the tokenizer's
ids against the plugin's hub; the way back through tupe-convert-hf; the refusals."""

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import unicodedata

import pytest
import sentencepiece as spm
import torch
from conftest import PRESETS, build_model, preset_encodings, test_data
from fairseq import checkpoint_utils, options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from tupe_plugin.cli.fairseq_tools import PLUGIN_DIR
from tupe_plugin.conversion import hf_export
from tupe_plugin.conversion.hf import convert
from tupe_plugin.conversion.hf_export import ExportError, export
from tupe_plugin.conversion.hf_import import ExportFolderError
from tupe_plugin.conversion.hf_remote import configuration_tupe
from tupe_plugin.conversion.official_tupe import converted_state
from tupe_plugin.models import TupeRobertaModel

SIZE = ["--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-attention-heads", "4",
        "--encoder-ffn-embed-dim", "64"]
MAX_POSITIONS = 96
# every exportable family: name -> (arch, extra flags); every preset whose encodings the export computes
# (the registry's ``exported``), as it is, then the options no preset sets
FAMILIES = {preset: (f"{preset}_tiny", []) for preset in PRESETS
            if all(encoding.exported for encoding in preset_encodings(preset))}
FAMILIES.update({
    "bert_r_cls_reset": ("bert_r_tiny", ["--cls-reset", "paper"]),
    "tupe_r_release": ("tupe_r_tiny", ["--cls-reset", "release", "--untied-proj-bias"]),
    "bert_rpe": ("bert_rpe_tiny", ["--shaw-max-distance", "4"]),
    "bert_a_sin_rpe_keys_only": ("bert_a_sin_rpe_tiny", ["--shaw-keys-only"]),
    "bert_lrope_linear": ("bert_lrope_tiny", ["--rotary-scaling", "linear", "--rotary-scaling-factor", "2"]),
    "bert_rope_ntk": ("bert_rope_tiny", ["--rotary-scaling", "ntk", "--rotary-scaling-factor", "3"]),
    "tupe_r_pre_ln": ("tupe_r_tiny", ["--encoder-normalize-before", "--layer-norm-eps", "1e-12",
                                      "--activation-fn", "gelu_accurate"]),
    "bert_a_no_embedding_norm": ("bert_a_tiny", ["--no-layernorm-embedding"]),
    "bert_kerple_power_cls": ("bert_kerple_tiny", ["--rel-pos", "kerple-power", "--cls-reset", "paper"]),
    "bert_kerple_log_softplus": ("bert_kerple_tiny", ["--kerple-param", "softplus"]),
    "bert_kerple_power_softplus": ("bert_kerple_tiny", ["--rel-pos", "kerple-power", "--kerple-param",
                                                        "softplus"]),
    "tupe_a_kerple": ("tupe_a_tiny", ["--rel-pos", "kerple-log"]),
    "bert_sandwich_zero_based_cls": ("bert_sandwich_tiny", ["--sandwich-frequencies", "zero-based",
                                                            "--sandwich-dim", "16", "--sandwich-scale", "2.5",
                                                            "--cls-reset", "paper"]),
    "bert_fire_short": ("bert_fire_tiny", ["--fire-threshold", "8"]),
    "bert_fire_signed_length_cls": ("bert_fire_tiny", ["--fire-signed", "--fire-normaliser", "length",
                                                       "--fire-threshold", "8", "--fire-hidden", "8",
                                                       "--cls-reset", "paper"]),
    "deberta": ("deberta_tiny", ["--deberta-max-distance", "8"]),
    "deberta_v2": ("deberta_tiny", ["--deberta-buckets", "8", "--deberta-max-distance", "20",
                                    "--deberta-share-att-key", "--deberta-table-norm"]),
    "deberta_paper_abs": ("deberta_tiny", ["--deberta-p2c", "paper", "--deberta-rel-proj-bias", "none",
                                           "--abs-pos", "learned", "--deberta-max-distance", "6"]),
    "deberta_emd": ("deberta_emd_tiny", ["--deberta-rel-proj-bias", "both", "--deberta-emd-layers", "3",
                                         "--deberta-buckets", "6", "--deberta-max-distance", "12"]),
    "deberta_emd_pre_ln": ("deberta_emd_tiny", ["--encoder-normalize-before"]),
})
# FIRE's normaliser reads the batch's length: its shortest row is also run alone
FIRE_FAMILIES = ("bert_fire", "bert_fire_short", "bert_fire_signed_length_cls")
TEXTS = [
    "Senjō no Valkyria 3 : Unrecorded Chronicles is a role @-@ playing video game developed by Sega .",
    "Café déjà vu: 1,234 naïve façades — über 56 % 😀 in 2011!",
    "ℵ₀ ⊂ 𝔘 «тест» 漢字",
    "The game began development in 2010 .",
]
CHILD = r"""
import sys, json, torch
sys.modules["fairseq"] = None
sys.modules["tupe_plugin"] = None
from transformers import (AutoModel, AutoModelForMaskedLM, AutoModelForQuestionAnswering,
                          AutoModelForSequenceClassification, AutoTokenizer)
request = json.load(open(sys.argv[1]))
batch = torch.load(request["batch"])
results = {}
with torch.no_grad():
    for name, folder in request["exports"].items():
        ids, mask = batch["input_ids"], batch["attention_mask"]
        mlm = AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True).eval()
        base = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
        classifier = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True).eval()
        qa = AutoModelForQuestionAnswering.from_pretrained(folder, trust_remote_code=True).eval()
        span = qa(input_ids=ids, attention_mask=mask)
        results[name] = dict(
            logits=mlm(input_ids=ids, attention_mask=mask).logits,
            features=base(input_ids=ids, attention_mask=mask).last_hidden_state,
            eager=base(input_ids=ids, attention_mask=mask, output_attentions=True).last_hidden_state,
            classes=classifier(input_ids=ids, attention_mask=mask).logits,
            start=span.start_logits, end=span.end_logits,
        )
        if name in request["alone"]:
            row = int(mask.sum(1).argmin())
            results[name]["alone"] = mlm(input_ids=ids[row:row + 1, :int(mask[row].sum())]).logits[0]
    tokenizer = AutoTokenizer.from_pretrained(request["tokenizer"], trust_remote_code=True)
    results["ids"] = [tokenizer(text)["input_ids"] for text in request["texts"]]
    results["pair"] = tokenizer(request["texts"][0], request["texts"][1])["input_ids"]
torch.save(results, request["out"])
"""


def transformers_only(code, *args, modules, timeout=600):
    """Run ``code`` in a Python that cannot import fairseq or tupe_plugin (no PYTHONPATH to the repo), with
    transformers' copies of remote code in ``modules``."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_MODULES_CACHE=str(modules), HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                            env=env, cwd="/", timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def wikitext_sentencepiece(root, vocab_size):
    """(lines, processor): 300 WikiText-2 lines written to ``root/raw.txt`` and the unigram sentencepiece
    model of ``vocab_size`` pieces trained on them (``root/spm.model``)."""
    with open(test_data("wikitext-2", "wiki.valid.head.tokens"), encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()][:300]
    (root / "raw.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(root / "raw.txt"), model_prefix=str(root / "spm"),
                                   vocab_size=vocab_size, model_type="unigram", minloglevel=2)
    return lines, spm.SentencePieceProcessor(model_file=str(root / "spm.model"))


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    """A sentencepiece model of WikiText-2 lines and a dict.txt missing some of its pieces (unknown
    pieces)."""
    root = tmp_path_factory.mktemp("export_data")
    _, processor = wikitext_sentencepiece(root, 250)
    pieces = [processor.id_to_piece(i) for i in range(3, processor.get_piece_size())]
    data = root / "data-bin"
    data.mkdir()
    (data / "dict.txt").write_text("".join(f"{piece} {100 - i % 50}\n" for i, piece in enumerate(pieces)
                                           if i % 7 != 3), encoding="utf-8")
    (data / "sentencepiece.bpe.model").write_bytes((root / "spm.model").read_bytes())
    return data


MASKED_LM = ["--task", "masked_lm", "--criterion", "masked_lm", "--tokens-per-sample", str(MAX_POSITIONS)]


def make_checkpoint(data, path, arch, flags, heads=True, seed=0, task=MASKED_LM, max_positions=MAX_POSITIONS):
    """A plugin checkpoint of ``arch`` with random weights far from their initialisation and, with
    ``heads`` (True, or the kinds: "classification", "span"), a 3-class classification head and a span
    head; ``task``: the fairseq task's flags (a fine-tuning task builds its own head)."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        str(data), "--user-dir", PLUGIN_DIR, *task, "--arch", arch, "--max-positions", str(max_positions),
        *SIZE, "--dropout", "0.1", *flags])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    kinds = ("classification", "span") if heads is True else heads or ()
    if "classification" in kinds:
        model.register_classification_head("sst", num_classes=3)
    if "span" in kinds:
        model.register_span_head("squad")
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "frequencies" in name or "log_slopes" in name or "threshold" in name:
                parameter.mul_(torch.exp(0.1 * torch.randn_like(parameter)))
            elif name.endswith((".r1", ".r2")):  # KERPLE's clamped coefficients: below, within, above bounds
                parameter.copy_(torch.linspace(-0.5, 2.7, parameter.numel()))
            elif "embed_tokens" in name:
                parameter.copy_(torch.randn_like(parameter) * 0.3)
            else:
                gain = "norm" in name and name.endswith("weight")
                parameter.copy_(torch.randn_like(parameter) * (0.3 if parameter.dim() > 1 else 0.5) + gain)
    torch.save(converted_state(cfg, model, path), path)
    return path


def plugin_outputs(path, data, batch):
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"data": str(data), "load_checkpoint_heads": True})
    model = models[0].eval()
    tokens = batch["input_ids"].masked_fill(batch["attention_mask"].eq(0), 1)
    with torch.no_grad():
        return dict(
            logits=model(tokens)[0],
            features=model(tokens, features_only=True)[0],
            classes=model(tokens, features_only=True, classification_head_name="sst")[0],
            **dict(zip(("start", "end"), model(tokens, span_head_name="squad")[0])),
        )


def plugin_row_alone(path, data, batch):
    """The plugin's masked-LM logits (T, V) of the batch's shortest row, run alone."""
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(path)],
                                                                 arg_overrides={"data": str(data)})
    mask = batch["attention_mask"]
    row = int(mask.sum(1).argmin())
    with torch.no_grad():
        return models[0].eval()(batch["input_ids"][row:row + 1, :int(mask[row].sum())])[0][0]


def plugin_batch(data, path):
    hub = TupeRobertaModel.from_pretrained(os.path.dirname(path), os.path.basename(path), str(data),
                                           sentencepiece_model=str(data / "sentencepiece.bpe.model"))
    rows = [hub.encode(text) for text in TEXTS]
    ids = torch.full((len(rows), max(map(len, rows))), 7)  # the padding of the exported side: any id
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, :len(row)], mask[i, :len(row)] = row, 1
    return dict(input_ids=ids, attention_mask=mask), rows, hub.encode(TEXTS[0], TEXTS[1])


@pytest.fixture(scope="module")
def exported(data_bin, tmp_path_factory):
    """Every family exported; the transformers-only child's outputs; the plugin's ids and batch."""
    root = tmp_path_factory.mktemp("exports")
    exports = {}
    for name, (arch, flags) in FAMILIES.items():
        checkpoint = make_checkpoint(data_bin, root / f"{name}.pt", arch, flags)
        exports[name] = export(str(checkpoint), str(data_bin), str(root / name))
    batch, rows, pair = plugin_batch(data_bin, root / "tupe_r.pt")
    torch.save(batch, root / "batch.pt")
    request = dict(exports=exports, batch=str(root / "batch.pt"), texts=TEXTS, tokenizer=exports["tupe_r"],
                   out=str(root / "results.pt"), alone=FIRE_FAMILIES)
    (root / "request.json").write_text(json.dumps(request))
    transformers_only(CHILD, root / "request.json", modules=root / "modules")
    return root, torch.load(root / "results.pt"), batch, rows, pair


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_export_equals_the_plugin_on_a_padded_batch_of_real_text(exported, data_bin, family):
    root, results, batch, _, _ = exported
    expected = plugin_outputs(root / f"{family}.pt", data_bin, batch)
    real = batch["attention_mask"].bool()
    ours = results[family]
    for output in ("logits", "features", "start", "end"):
        torch.testing.assert_close(ours[output][real], expected[output][real], atol=1e-5, rtol=1e-5,
                                   msg=lambda m, output=output: f"{family} {output}: {m}")
    torch.testing.assert_close(ours["eager"][real], expected["features"][real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours["classes"], expected["classes"], atol=1e-5, rtol=1e-5)


def test_tokenizer_gives_the_plugin_ids_for_accents_digits_emoji_and_unknown_characters(exported):
    _, results, _, rows, pair = exported
    assert results["ids"] == [row.tolist() for row in rows]
    assert 3 in rows[2].tolist()  # characters outside the vocabulary: <unk>
    assert results["pair"] == pair.tolist()


def test_export_writes_the_remote_code_config_and_model_card(exported):
    root, *_ = exported
    folder = root / "tupe_r"
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "tupe" and config["auto_map"]["AutoModelForMaskedLM"] == \
        "modeling_tupe.TupeForMaskedLM"
    assert config["fairseq_model_args"]["arch"] == "tupe_r_tiny" and config["num_labels"] == 3
    for name in hf_export.CODE_FILES + ("model.safetensors", "vocab.txt", "sentencepiece.bpe.model"):
        assert (folder / name).is_file()
    card = (folder / "README.md").read_text()
    assert "tupe_r_tiny" in card and "arXiv 2006.15595" in card and "0 updates" in card


@pytest.mark.parametrize("family", FIRE_FAMILIES)
def test_fire_export_gives_a_row_alone_the_plugins_logits_alone(exported, data_bin, family):
    root, results, batch, _, _ = exported
    expected = plugin_row_alone(root / f"{family}.pt", data_bin, batch)
    torch.testing.assert_close(results[family]["alone"], expected, atol=1e-5, rtol=1e-5)


def test_fire_row_in_a_padded_batch_longer_than_its_threshold_differs_from_the_row_alone(exported):
    root, results, batch, _, _ = exported
    mask = batch["attention_mask"]
    row = int(mask.sum(1).argmin())
    state = torch.load(root / "bert_fire_short.pt", weights_only=False)["model"]
    # the batch's largest distance beyond the threshold L, and so beyond the row's
    assert mask.size(1) - 1 > state["encoder.sentence_encoder.positional_term.relative_bias.threshold"]
    in_batch = results["bert_fire_short"]["logits"][row, :int(mask[row].sum())]
    assert not torch.allclose(in_batch, results["bert_fire_short"]["alone"], atol=1e-3)


def test_fire_row_in_a_padded_batch_within_its_threshold_equals_the_row_alone(exported):
    _, results, batch, _, _ = exported
    mask = batch["attention_mask"]
    row = int(mask.sum(1).argmin())
    in_batch = results["bert_fire"]["logits"][row, :int(mask[row].sum())]
    torch.testing.assert_close(in_batch, results["bert_fire"]["alone"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family, paper", [
    ("bert_kerple", "arXiv 2205.09921"), ("bert_sandwich", "arXiv 2212.10356"),
    ("bert_fire", "arXiv 2310.04418"), ("deberta_emd", "arXiv 2006.03654"),
])
def test_model_card_cites_the_paper_of_the_encoding(exported, family, paper):
    root, *_ = exported
    assert paper in (root / family / "README.md").read_text()


def test_model_card_names_the_options_of_the_encoding(exported):
    root, *_ = exported
    card = (root / "deberta_emd" / "README.md").read_text()
    assert "--rel-pos deberta" in card and "--deberta-emd, --deberta-emd-layers 3" in card


@pytest.mark.parametrize("preset", [preset for preset in PRESETS if preset not in FAMILIES])
def test_a_preset_the_export_does_not_compute_is_refused_in_one_line_naming_its_encoding(preset):
    args = argparse.Namespace(**vars(build_model(f"{preset}_tiny").args))
    refused = next(encoding for encoding in preset_encodings(preset) if not encoding.exported)
    message = rf"^model.pt: {re.escape(refused.label)} \(.*\) cannot be exported: [^\n]*with fairseq$"
    with pytest.raises(ExportError, match=message):
        hf_export.check_exportable(args, "model.pt")


def test_data_bin_of_another_dictionary_is_refused_naming_the_file(data_bin, tmp_path):
    checkpoint = make_checkpoint(data_bin, tmp_path / "model.pt", "bert_a_tiny", [], heads=False)
    other = tmp_path / "other"
    other.mkdir()
    (other / "dict.txt").write_text("a 1\nb 1\n")
    (other / "sentencepiece.bpe.model").write_bytes((data_bin / "sentencepiece.bpe.model").read_bytes())
    with pytest.raises(SystemExit, match=r"^tupe-export-hf: error: .*dict.txt gives 7 symbols "
                                         r"\(with <mask>\) but the checkpoint's embeddings have"):
        hf_export.main([str(checkpoint), str(other), "--out", str(tmp_path / "out")])


def test_several_heads_of_one_kind_need_head(data_bin, tmp_path):
    checkpoint = make_checkpoint(data_bin, tmp_path / "model.pt", "bert_a_tiny", [])
    state = torch.load(checkpoint, weights_only=False)
    for key in [k for k in state["model"] if k.startswith("classification_heads.sst.")]:
        state["model"][key.replace(".sst.", ".mnli.")] = state["model"][key]
    torch.save(state, checkpoint)
    with pytest.raises(ExportError, match="has the classification heads mnli, sst: choose one with --head"):
        export(str(checkpoint), str(data_bin), str(tmp_path / "out"))
    export(str(checkpoint), str(data_bin), str(tmp_path / "out"), head="mnli")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["fairseq_head_names"]["classification"] == "mnli"


@pytest.mark.parametrize("family", ["tupe_r", "tupe_r_release", "bert_lsin_ape_lsin_rpe", "bert_alibi_asym",
                                    "bert_kerple_power_cls", "bert_kerple_log_softplus",
                                    "bert_sandwich_zero_based_cls", "bert_fire_signed_length_cls", "deberta",
                                    "deberta_v2", "deberta_emd"])
def test_convert_hf_on_an_export_gives_the_checkpoint_back(exported, family, tmp_path):
    root, *_ = exported
    convert(str(root / family), str(tmp_path / "back"))
    original = torch.load(root / f"{family}.pt", weights_only=False)
    back = torch.load(tmp_path / "back" / "model.pt", weights_only=False)
    assert back["model"].keys() == original["model"].keys()
    assert all(torch.equal(back["model"][key], original["model"][key]) for key in original["model"])
    assert back["cfg"]["model"].arch == original["cfg"]["model"].arch


def edited_export(folder, tmp_path, edit):
    """A copy of the export ``folder`` whose config.json ``edit`` (a function of the config) changed."""
    shutil.copytree(folder, tmp_path / "edited")
    config = json.loads((tmp_path / "edited" / "config.json").read_text())
    edit(config)
    (tmp_path / "edited" / "config.json").write_text(json.dumps(config))
    return tmp_path / "edited"


@pytest.mark.parametrize("field, value, recorded", [
    ("layer_norm_eps", 0.5, "1e-05"), ("hidden_act", "relu", '"gelu"'), ("num_hidden_layers", 1, "2"),
    ("hidden_act", "nonexistent_act", '"gelu"')])
def test_convert_hf_refuses_an_export_whose_transformers_fields_were_edited(exported, tmp_path, field, value,
                                                                            recorded):
    root, *_ = exported
    folder = edited_export(root / "tupe_r", tmp_path, lambda config: config.update({field: value}))
    with pytest.raises(ExportFolderError, match=re.escape(
            f"config.json: {field} = {json.dumps(value)}, but the model recorded in its fairseq_model_args, "
            f"which the checkpoint is rebuilt from, has {recorded}: the folder was edited")):
        convert(str(folder), str(tmp_path / "back"))
    assert not (tmp_path / "back").exists()


def test_convert_hf_refuses_an_export_whose_recorded_flags_were_edited(exported, tmp_path):
    root, *_ = exported
    folder = edited_export(root / "tupe_r", tmp_path,
                           lambda config: config["fairseq_model_args"].update(activation_fn="relu"))
    with pytest.raises(ExportFolderError, match=re.escape('config.json: hidden_act = "gelu", but the model '
                                                          'recorded in its fairseq_model_args')):
        convert(str(folder), str(tmp_path / "back"))


LOAD_AND_TRAIN = r"""
import sys, torch
sys.modules["fairseq"] = None
sys.modules["tupe_plugin"] = None
from transformers import AutoModelForSequenceClassification, AutoTokenizer
folder, out, trainer = sys.argv[1], sys.argv[2], sys.argv[3] == "trainer"
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)
texts = ["a good game .", "the worst film of 2010 !", "Café déjà vu", "it was fine"]
before = model.classifier.out_proj.weight.detach().clone()
if trainer:
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments
    examples = [dict(tokenizer(text), labels=i % 3) for i, text in enumerate(texts)]
    arguments = TrainingArguments(output_dir=out + "/trainer", per_device_train_batch_size=4, max_steps=1,
                                  learning_rate=1e-3, report_to=[], use_cpu=True, save_strategy="no")
    Trainer(model=model, args=arguments, train_dataset=examples,
            data_collator=DataCollatorWithPadding(tokenizer)).train()
else:
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    model.train()
    model(**batch, labels=torch.tensor([0, 1, 2, 0])).loss.backward()
    torch.optim.SGD(model.parameters(), lr=1e-2).step()
assert not torch.equal(before, model.classifier.out_proj.weight), "the step changed nothing"
model.save_pretrained(out + "/saved")
tokenizer.save_pretrained(out + "/saved")
model.eval()
again = AutoModelForSequenceClassification.from_pretrained(out + "/saved", trust_remote_code=True).eval()
batch = AutoTokenizer.from_pretrained(out + "/saved", trust_remote_code=True)(texts, padding=True,
                                                                               return_tensors="pt")
with torch.no_grad():
    torch.testing.assert_close(again(**batch).logits, model(**batch).logits)
print("ok")
"""


def test_a_training_step_and_save_pretrained_of_a_loaded_export_load_again(exported, tmp_path):
    root, *_ = exported
    output = transformers_only(LOAD_AND_TRAIN, root / "tupe_r", tmp_path, "step",
                               modules=tmp_path / "modules")
    assert output.strip().endswith("ok")


def test_a_trainer_fine_tuning_step_runs_on_a_loaded_export(exported, tmp_path):
    root, *_ = exported
    output = transformers_only(LOAD_AND_TRAIN, root / "tupe_r", tmp_path, "trainer",
                               modules=tmp_path / "modules")
    assert output.strip().endswith("ok")


def labelled_checkpoint(data_bin, tmp_path, labels=None, outputs=None):
    """tupe_r's checkpoint fine-tuned (its 'sst' head) on data whose label/dict.txt lists ``labels``; with
    ``outputs`` the head keeps that many output rows (1: a regression head, as STS-B's)."""
    path = make_checkpoint(data_bin, tmp_path / "tuned.pt", "tupe_r_tiny", [])
    state = torch.load(path, weights_only=False)
    if labels is not None:
        (tmp_path / "task-bin" / "label").mkdir(parents=True)
        (tmp_path / "task-bin" / "label" / "dict.txt").write_text("".join(f"{name} 5\n" for name in labels))
        state["cfg"]["task"]["data"] = str(tmp_path / "task-bin")
    if outputs is not None:
        for name in ("weight", "bias"):
            key = f"classification_heads.sst.out_proj.{name}"
            state["model"][key] = state["model"][key][:outputs]
    torch.save(state, path)
    return path


def test_a_fine_tuned_heads_labels_are_named_from_its_datas_label_dictionary(data_bin, tmp_path):
    path = labelled_checkpoint(data_bin, tmp_path, labels=["negative", "neutral", "positive"])
    export(str(path), str(data_bin), str(tmp_path / "out"))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "neutral", "2": "positive"}
    assert config["label2id"] == {"negative": 0, "neutral": 1, "positive": 2}
    assert (config["num_labels"], config["problem_type"]) == (3, "single_label_classification")


def test_a_head_of_one_output_is_exported_as_regression(data_bin, tmp_path):
    path = labelled_checkpoint(data_bin, tmp_path, outputs=1)
    export(str(path), str(data_bin), str(tmp_path / "out"))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["num_labels"], config["problem_type"]) == (1, "regression")
    assert "id2label" not in config or len(config["id2label"]) == 1


@pytest.fixture(scope="module")
def whole_data_bin(tmp_path_factory):
    """A sentencepiece model of WikiText-2 lines and the dict.txt fairseq writes for their pieces: every
    piece by count, padded with fairseq's madeupword lines."""
    from fairseq.data import Dictionary

    root = tmp_path_factory.mktemp("whole_data")
    lines, processor = wikitext_sentencepiece(root, 251)
    dictionary = Dictionary()
    for i in range(3, processor.get_piece_size()):
        dictionary.add_symbol(processor.id_to_piece(i), n=0)
    for line in lines:
        for piece in processor.encode(line, out_type=str):
            dictionary.add_symbol(piece)
    dictionary.finalize(padding_factor=8)
    data = root / "data-bin"
    data.mkdir()
    dictionary.save(str(data / "dict.txt"))
    (data / "sentencepiece.bpe.model").write_bytes((root / "spm.model").read_bytes())
    return data


with open(test_data("wikitext-2", "wiki.valid.head.tokens"), encoding="utf-8") as _f:
    REAL_LINES = [line.strip() for line in _f if line.strip() and "<unk>" not in line]
# the hard cases of a tokenizer; the plugin's hub.encode gives their ids
HARD_TEXTS = {
    "accents": "Café déjà vu: naïve façades, über Ångström and e\u0301 combined",
    "digits": "1,234 and 56 % in 2011 ; 3.14159 and １２３",
    "emoji": "a 😀 b 👍🏽 and 🇫🇷 !",
    "outside the vocabulary": "ℵ₀ ⊂ 𝔘 «тест» 漢字 ﬁne",
    "spaces and tabs": "  two  spaces\tand\t\ttabs   and a\nnew line  ",
    "empty": "",
    # lines of real text; those with WikiText's "<unk>" placeholders aside (a special token written in a
    # text is that token, test_a_special_token_written_in_a_text_is_that_token)
    **{f"real {i}": line for i, line in enumerate(REAL_LINES[:40])},
}
LONG_TEXT = " ".join(REAL_LINES[:20])
FAST_CHILD = r"""
import sys, json
sys.modules["fairseq"] = None
sys.modules["tupe_plugin"] = None
from transformers import AutoTokenizer
request = json.load(open(sys.argv[1]))
tokenizer = AutoTokenizer.from_pretrained(request["folder"])
texts = request["texts"]
results = dict(
    is_fast=tokenizer.is_fast, name=type(tokenizer).__name__, max_length=tokenizer.model_max_length,
    ids={name: tokenizer(text)["input_ids"] for name, text in texts.items()},
    offsets={name: tokenizer(text, return_offsets_mapping=True)["offset_mapping"]
             for name, text in texts.items()},
    long=tokenizer(request["long"], truncation=True)["input_ids"],
    pair=tokenizer(request["pair"][0], request["pair"][1])["input_ids"],
    special=tokenizer(request["special"])["input_ids"],
    tokens={name: tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])
            for name, text in texts.items()},
)
json.dump(results, open(request["out"], "w"))
"""


@pytest.fixture(scope="module")
def fast_export(whole_data_bin, tmp_path_factory):
    """tupe_r exported with every piece in its dict.txt; the transformers-only child's tokenizer results;
    the plugin's hub."""
    root = tmp_path_factory.mktemp("fast_export")
    checkpoint = make_checkpoint(whole_data_bin, root / "tupe_r.pt", "tupe_r_tiny", [])
    folder = export(str(checkpoint), str(whole_data_bin), str(root / "export"))
    request = dict(folder=folder, texts=HARD_TEXTS, long=LONG_TEXT,
                   pair=[HARD_TEXTS["real 0"], HARD_TEXTS["accents"]], special="a <mask> b <unk> c </s>",
                   out=str(root / "results.json"))
    (root / "request.json").write_text(json.dumps(request))
    transformers_only(FAST_CHILD, root / "request.json", modules=root / "modules")
    hub = TupeRobertaModel.from_pretrained(
        str(root), "tupe_r.pt", str(whole_data_bin),
        sentencepiece_model=str(whole_data_bin / "sentencepiece.bpe.model"))
    return root, json.loads((root / "results.json").read_text()), hub


def test_an_export_loads_its_tokenizer_as_a_fast_one_without_remote_code(fast_export):
    root, results, _ = fast_export
    assert results["is_fast"] and results["name"] in ("TokenizersBackend", "PreTrainedTokenizerFast")
    config = json.loads((root / "export" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and "auto_map" not in config
    assert "AutoTokenizer" not in json.loads((root / "export" / "config.json").read_text())["auto_map"]
    assert not (root / "export" / hf_export.TOKENIZER_CODE).exists()


@pytest.mark.parametrize("case", sorted(HARD_TEXTS))
def test_the_fast_tokenizer_gives_the_plugins_ids(fast_export, case):
    _, results, hub = fast_export
    assert results["ids"][case] == hub.encode(HARD_TEXTS[case]).tolist()


def test_the_cases_reach_unknown_characters_and_the_dictionarys_padding_lines(fast_export, whole_data_bin):
    _, results, _ = fast_export
    assert 3 in results["ids"]["outside the vocabulary"] and 3 in results["ids"]["emoji"]
    assert "madeupword0000" in (whole_data_bin / "dict.txt").read_text()


def test_the_fast_tokenizer_gives_the_plugins_ids_for_a_sentence_pair(fast_export):
    _, results, hub = fast_export
    assert results["pair"] == hub.encode(HARD_TEXTS["real 0"], HARD_TEXTS["accents"]).tolist()


def test_the_fast_tokenizer_truncates_a_text_longer_than_the_model_to_its_positions(fast_export):
    _, results, hub = fast_export
    whole = hub.encode(LONG_TEXT).tolist()
    assert len(whole) > MAX_POSITIONS == results["max_length"]
    assert results["long"] == whole[:MAX_POSITIONS - 1] + [2]


@pytest.mark.parametrize("case", sorted(HARD_TEXTS))
def test_the_offsets_of_the_fast_tokenizer_point_into_the_original_text(fast_export, case):
    """A piece's span is the characters it stands for: its word's letters, after the whitespace its "▁"
    stands for; the "▁" sentencepiece puts in front of a text has the text's first character (the
    convention of transformers' sentencepiece tokenizers)."""
    _, results, _ = fast_export
    text = HARD_TEXTS[case]
    tokens, offsets = results["tokens"][case], results["offsets"][case]
    assert offsets[0] == offsets[-1] == [0, 0]  # <s> and </s>
    for i, (token, (start, end)) in enumerate(zip(tokens[1:-1], offsets[1:-1])):
        assert 0 <= start <= end <= len(text)
        span, surface = text[start:end], token.lstrip("▁")
        if token == "<unk>":
            assert span.strip()
        elif token == "▁" and i == 0:
            assert end == start + 1 and not text[:start].strip()
        elif unicodedata.normalize("NFKC", span) != span:  # "１" is "1", "ﬁ" the span of "f" and of "i"
            assert surface in unicodedata.normalize("NFKC", span), (token, span)
        else:
            assert span.lstrip() == surface and not span[:len(span) - len(surface)].strip(), (token, span)
    ends = [end for _, end in offsets[1:-1]]
    assert ends == sorted(ends)


def test_a_special_token_written_in_a_text_is_that_token(fast_export):
    _, results, hub = fast_export
    words = [hub.encode(word).tolist()[1:-1] for word in "abc"]
    mask = hub.task.source_dictionary.index("<mask>")
    assert results["special"] == [0, *words[0], mask, *words[1], 3, *words[2], 2, 2]


def test_a_dictionary_missing_a_sentencepiece_piece_keeps_the_custom_tokenizer_and_says_why(exported):
    root, *_ = exported
    folder = root / "tupe_r"
    assert not (folder / "tokenizer.json").exists() and (folder / hf_export.TOKENIZER_CODE).is_file()
    assert json.loads((folder / "tokenizer_config.json").read_text())["tokenizer_class"] == "TupeTokenizer"
    card = (folder / "README.md").read_text()
    assert "pieces of its sentencepiece model are not in dict.txt" in card
    assert "AutoTokenizer.from_pretrained(FOLDER, trust_remote_code=True)" in card


def test_the_model_card_names_files_never_paths_of_the_machine(fast_export):
    root, *_ = fast_export
    card = (root / "export" / "README.md").read_text()
    assert "exported from `tupe_r.pt`" in card and "updates on `data-bin`" in card
    assert str(root) not in card and str(root.parent) not in card and "/tmp" not in card


def refusal(argv):
    """tupe-export-hf's error line for ``argv``."""
    with pytest.raises(SystemExit) as stop:
        hf_export.main(list(map(str, argv)))
    message = str(stop.value.code)
    assert message.startswith("tupe-export-hf: error: ") and "\n" not in message
    return message


@pytest.fixture
def run(data_bin, tmp_path):
    """A run folder (run/model.pt) and a copy of the data-bin, in tmp_path; the files every refusal leaves."""
    data = tmp_path / "data-bin"
    shutil.copytree(data_bin, data)
    (tmp_path / "run").mkdir()
    checkpoint = make_checkpoint(data, tmp_path / "run" / "model.pt", "bert_a_tiny", [])
    return checkpoint, data, lambda: sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("force", [False, True], ids=["", "--force"])
@pytest.mark.parametrize("out, meeting", [
    ("data-bin", "is DATA_BIN"), ("data-bin/export", "lies inside DATA_BIN"), ("run", "holds CKPT"),
    (".", "holds CKPT"),
])
def test_an_out_that_is_holds_or_lies_inside_an_input_is_refused_before_anything_is_written(
        run, tmp_path, out, meeting, force):
    checkpoint, data, files = run
    before = files()
    message = refusal([checkpoint, data, "--out", tmp_path / out, *(["--force"] if force else [])])
    assert f"--out {tmp_path / out} {meeting} " in message
    assert message.endswith("which the export would replace (--force or not): give another --out")
    assert files() == before


def test_command_line_ends_with_the_output_folder_and_how_to_load_it(run, tmp_path, capsys):
    checkpoint, data, _ = run
    out = tmp_path / "export"
    assert hf_export.main([str(checkpoint), str(data), "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-3:] == [
        "tupe-export-hf: done",
        f"output folder: {out} (model.safetensors, config.json, the tokenizer, README.md: the model card)",
        f"load it with:  AutoModelForMaskedLM.from_pretrained({str(out)!r}, trust_remote_code=True)"]


def test_force_replaces_only_a_previous_export(run, tmp_path):
    checkpoint, data, _ = run
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text("mine")
    assert refusal([checkpoint, data, "--out", tmp_path / "notes", "--force"]).endswith(
        "holds files but no previous export (no config.json of a tupe model): --force replaces only a "
        "previous export; choose another --out")
    assert (tmp_path / "notes" / "notes.txt").read_text() == "mine"
    export(str(checkpoint), str(data), str(tmp_path / "export"))
    (tmp_path / "export" / "README.md").write_text("of the previous export")
    export(str(checkpoint), str(data), str(tmp_path / "export"), force=True)
    assert (tmp_path / "export" / "README.md").read_text() != "of the previous export"
    assert (tmp_path / "export" / "config.json").is_file()


def test_force_into_a_previous_export_holding_the_users_files_is_refused_and_keeps_them(run, tmp_path):
    checkpoint, data, _ = run
    out = tmp_path / "export"
    export(str(checkpoint), str(data), str(out))
    (out / "NOTES.txt").write_text("mine")
    (out / "runs").mkdir()
    (out / "runs" / "log.txt").write_text("mine too")
    before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    assert refusal([checkpoint, data, "--out", out, "--force"]) == (
        f"tupe-export-hf: error: --out {out} holds a previous export and NOTES.txt, runs/, which an export "
        "does not write: --force replaces only the export's files; move them out of --out or choose another "
        "--out")
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == before


def test_a_shuffled_dictionary_of_the_same_size_is_refused_by_its_fingerprint(run):
    checkpoint, data, files = run
    lines = (data / "dict.txt").read_text().splitlines(keepends=True)
    (data / "dict.txt").write_text("".join(lines[1:] + lines[:1]))
    before = files()
    message = refusal([checkpoint, data, "--out", data.parent / "export"])
    assert re.fullmatch(r"tupe-export-hf: error: \S+dict.txt \(fingerprint \w+\) is not the dictionary "
                        r"the checkpoint was trained with \(fingerprint \w+\): .*pass the DATA_BIN the "
                        r"checkpoint was trained with", message)
    assert files() == before


def test_another_sentencepiece_model_is_refused(run, tmp_path):
    checkpoint, data, files = run
    with open(test_data("glue", "SST-2", "train.tsv"), encoding="utf-8") as f:
        (tmp_path / "other.txt").write_text(f.read(), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(tmp_path / "other.txt"), model_prefix=str(tmp_path / "other"),
                                   vocab_size=60, model_type="char", minloglevel=2)
    shutil.copy(tmp_path / "other.model", data / "sentencepiece.bpe.model")
    before = files()
    message = refusal([checkpoint, data, "--out", tmp_path / "export"])
    assert f"symbols of DATA_BIN {data / 'dict.txt'} (e.g. " in message
    assert message.endswith(f"are not pieces of DATA_BIN {data / 'sentencepiece.bpe.model'}: the dictionary "
                            "was built for another sentencepiece model; pass the pair of the pre-training "
                            "data-bin (its sentencepiece.bpe.model and dict.txt)")
    assert files() == before


def test_a_checkpoint_whose_record_fails_its_checksum_is_refused_naming_it(run, tmp_path):
    from test_checkpoint_integrity import damaged_copy

    checkpoint, data, _ = run
    damaged_copy(checkpoint, checkpoint)
    message = refusal([checkpoint, data, "--out", tmp_path / "export"])
    assert f"{checkpoint} is corrupted: " in message and not (tmp_path / "export").exists()


def test_a_head_the_checkpoint_does_not_have_is_refused(run, tmp_path):
    checkpoint, data, _ = run
    assert refusal([checkpoint, data, "--out", tmp_path / "export", "--head", "nosuch"]).endswith(
        f"--head nosuch: {checkpoint} has no such head (its heads: sst (classification), squad (span)): give "
        "one of them, or no --head")


def test_labels_are_named_without_the_padding_lines_of_the_label_dictionary(data_bin, tmp_path):
    padding = [f"madeupword{i:04d}" for i in range(5)]
    path = labelled_checkpoint(data_bin, tmp_path, labels=["negative", "neutral", "positive", *padding])
    export(str(path), str(data_bin), str(tmp_path / "out"))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "neutral", "2": "positive"}


@pytest.mark.parametrize("argv, expected", [
    (lambda c, d, t: [c, t / "file.txt", "--out", t / "o"], "DATA_BIN {t}/file.txt: a file, not a folder"),
    (lambda c, d, t: [t, d, "--out", t / "o"], "CKPT {t}: a folder, not a file"),
    (lambda c, d, t: [c, d, "--out", t / "file.txt"], "--out {t}/file.txt: a file, not a folder: give a new "
                                                      "folder"),
    (lambda c, d, t: [c, d, "--out", t / "link"], "--out {t}/link is a symbolic link: give the folder itself "
                                                  "(the export replaces --out whole)"),
    (lambda c, d, t: [c, d, "--out", "/proc/tupe-export"], "--out /proc/tupe-export: cannot write beside it "
                                                           "in /proc ("),
], ids=["DATA_BIN a file", "CKPT a folder", "--out a file", "--out a link", "--out unwritable"])
def test_paths_of_the_wrong_kind_are_refused_naming_them(run, tmp_path, argv, expected):
    checkpoint, data, _ = run
    (tmp_path / "file.txt").write_text("")
    (tmp_path / "target").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    message = refusal(argv(checkpoint, data, tmp_path))
    assert message.startswith("tupe-export-hf: error: " + expected.format(t=tmp_path))
    assert not list((tmp_path / "target").iterdir())


def test_without_tokenizers_the_export_names_its_extra(run, tmp_path, monkeypatch):
    checkpoint, data, _ = run
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    assert refusal([checkpoint, data, "--out", tmp_path / "export"]) == (
        "tupe-export-hf: error: tupe-export-hf needs tokenizers, which is not installed: pip install "
        "'tupe-plugin[export]'")
    assert not (tmp_path / "export").exists()


def test_convert_hf_on_an_export_with_the_fast_tokenizer_gives_the_checkpoint_back(fast_export, tmp_path):
    root, *_ = fast_export
    convert(str(root / "export"), str(tmp_path / "back"))
    original = torch.load(root / "tupe_r.pt", weights_only=False)["model"]
    back = torch.load(tmp_path / "back" / "model.pt", weights_only=False)["model"]
    assert back.keys() == original.keys() and all(torch.equal(back[key], original[key]) for key in original)


# ---------------------------------------------------------------- config.json checked field by field

@pytest.fixture(scope="module")
def checked_export(data_bin, tmp_path_factory):
    """A TUPE-R export (T5's bias, the untied term) whose config.json the tests below tamper with."""
    root = tmp_path_factory.mktemp("checked-export")
    checkpoint = make_checkpoint(data_bin, root / "tupe_r.pt", "tupe_r_tiny", [], heads=False)
    return pathlib.Path(export(str(checkpoint), str(data_bin), str(root / "export")))


def _bad_values(name):
    """Values field ``name`` does not take, from what the exported configuration says it takes."""
    if name in configuration_tupe.CHOICES:
        return ["bogus", 3, None]
    if name in configuration_tupe.BOOLEANS:
        return ["yes", 1]
    if name in configuration_tupe.INTEGERS:
        least = configuration_tupe.INTEGERS[name]
        beyond = [configuration_tupe.LARGEST[name] + 1, 10 ** 9] if name in configuration_tupe.LARGEST else []
        return [least - 1, -4, 1e9, float(least), "8", True, *beyond]
    if name in configuration_tupe.NUMBERS:
        least, included = configuration_tupe.NUMBERS[name]
        return [float("nan"), float("inf"), least - 1 if included else least, "1.0"]
    return [float("nan"), 1.0, -0.1, "0.1"]


CHECKED_FIELDS = [*configuration_tupe.CHOICES, *configuration_tupe.BOOLEANS, *configuration_tupe.INTEGERS,
                  *configuration_tupe.NUMBERS, *configuration_tupe.PROBABILITIES]


def _tampered(folder, tmp_path, change):
    """A copy of the export ``folder``'s config.json, changed by ``change(config)``, in ``tmp_path``."""
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_every_field_the_configuration_checks_is_in_the_export_and_loads(checked_export):
    config = json.loads((checked_export / "config.json").read_text())
    assert set(CHECKED_FIELDS) <= set(config) and set(configuration_tupe.REQUIRED) <= set(config)
    loaded = configuration_tupe.TupeConfig.from_pretrained(checked_export)
    assert loaded.rel_pos == "t5" and loaded.untied_pos == "tupe"


@pytest.mark.parametrize("name", CHECKED_FIELDS)
def test_a_config_field_tampered_with_is_refused_naming_it_and_what_it_takes(checked_export, tmp_path, name):
    for bad in _bad_values(name):
        folder = _tampered(checked_export, tmp_path, lambda config: config.__setitem__(name, bad))
        with pytest.raises(ValueError) as error:
            configuration_tupe.TupeConfig.from_pretrained(folder)
        message = str(error.value)
        assert message.startswith(f"config.json: {name} = {bad!r}, but {name} takes "), message
        assert "\n" not in message and message.endswith("export the checkpoint again with tupe-export-hf, or "
                                                        "correct the field in config.json")


@pytest.mark.parametrize("name", configuration_tupe.REQUIRED)
def test_a_required_config_field_deleted_is_refused_naming_it(checked_export, tmp_path, name):
    folder = _tampered(checked_export, tmp_path, lambda config: config.pop(name))
    with pytest.raises(ValueError, match=rf"^config.json has no {name} \("):
        configuration_tupe.TupeConfig.from_pretrained(folder)


@pytest.mark.parametrize("change, message", [
    (dict(hidden_size=30), "hidden_size = 30 is no multiple of num_attention_heads = 4"),
    (dict(rel_pos_buckets=31), "rel_pos_buckets = 31, but T5's buckets"),
])
def test_config_fields_that_do_not_fit_together_are_refused(checked_export, tmp_path, change, message):
    folder = _tampered(checked_export, tmp_path, lambda config: config.update(change))
    with pytest.raises(ValueError, match=re.escape(message)):
        configuration_tupe.TupeConfig.from_pretrained(folder)


def test_the_activation_names_are_the_models():
    from tupe_plugin.conversion.hf_remote import modeling_tupe

    assert set(configuration_tupe.ACTIVATION_NAMES) == set(modeling_tupe.ACTIVATIONS)


UNEXPLAINED_CHILD = r"""
import sys, json
sys.modules["fairseq"] = None
sys.modules["tupe_plugin"] = None
from transformers import AutoModel, AutoModelForMaskedLM
results = {}
for name, folder in json.loads(sys.argv[1]).items():
    try:
        AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True)
        AutoModel.from_pretrained(folder, trust_remote_code=True)
        results[name] = "loaded"
    except ValueError as error:
        results[name] = str(error)
print(json.dumps(results))
"""


def test_weights_the_config_does_not_explain_are_an_error_not_a_report(checked_export, tmp_path):
    folders = {}
    for name, change in {"as exported": {}, "rel_pos none": dict(rel_pos="none"),
                         "untied_pos none": dict(untied_pos="none"), "rel_pos alibi": dict(rel_pos="alibi"),
                         "rel_pos bogus": dict(rel_pos="bogus")}.items():
        folder = tmp_path / name.replace(" ", "-")
        shutil.copytree(checked_export, folder)
        _tampered(checked_export, folder, lambda config, change=change: config.update(change))
        folders[name] = str(folder)
    output = transformers_only(UNEXPLAINED_CHILD, json.dumps(folders), modules=tmp_path / "modules")
    results = json.loads(output.strip().splitlines()[-1])
    assert results["as exported"] == "loaded"
    for name in ("rel_pos none", "untied_pos none"):
        assert results[name].startswith("the export holds weights its config.json does not describe ("), \
            results[name]
    assert results["rel_pos alibi"].startswith("the export holds weights its config.json does not "
                                               "describe"), results["rel_pos alibi"]
    assert results["rel_pos bogus"].startswith("config.json: rel_pos = 'bogus', but rel_pos takes one of "
                                               "'none'"), results["rel_pos bogus"]
