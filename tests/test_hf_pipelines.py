"""transformers' pipelines on exports, in the transformers-only child process of tests/test_hf_export.py,
on real text: fill-mask's top prediction is the plugin's at the mask; question answering on an exported
SQuAD fine-tune (transformers 5 removed its pipeline: the fast tokenizer's offsets and the span head,
decoded as that pipeline did, on the question and passage framed as tupe-prepare-squad frames them) gives
the span tupe-evaluate-squad predicts; text-classification on an exported GLUE fine-tune gives the
plugin's label. The fine-tunes are checkpoints of the fine-tuning tasks with random weights: the pipelines
and the plugin read the same weights, so their answers must agree, whatever they are."""

import json

import pytest
import torch
from conftest import test_data
from test_hf_export import make_checkpoint, transformers_only, whole_data_bin  # noqa: F401  (a fixture)

from tupe_plugin.conversion.hf_export import export
from tupe_plugin.glue import prepare as prepare_glue
from tupe_plugin.models import TupeRobertaModel
from tupe_plugin.squad import evaluate as evaluate_squad
from tupe_plugin.squad import prepare as prepare_squad

# the fine-tunes' positions: a SQuAD paragraph and its question, an SST-2 sentence in one window
SQUAD_POSITIONS, GLUE_POSITIONS = 1024, 512
PIPELINES = r"""
import sys, json
sys.modules["fairseq"] = None
sys.modules["tupe_plugin"] = None
import torch
from transformers import AutoModelForQuestionAnswering, AutoTokenizer, pipeline
request = json.load(open(sys.argv[1]))
kind, folder, inputs = request["pipeline"], request["folder"], request["inputs"]
if kind == "question-answering":  # transformers 5 has no pipeline for it: its extractive decoding, by offsets
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForQuestionAnswering.from_pretrained(folder, trust_remote_code=True).eval()
    results = {}
    for qid, question, context in inputs:
        # as tupe-prepare-squad frames a feature: <s> question </s> passage </s>
        passage = tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)
        first = len(tokenizer(question)["input_ids"])
        ids = tokenizer(question)["input_ids"] + passage["input_ids"] + [tokenizer.eos_token_id]
        with torch.no_grad():
            output = model(input_ids=torch.tensor([ids]))
        start, end = output.start_logits[0, first:-1], output.end_logits[0, first:-1]
        offsets = passage["offset_mapping"]
        spans = [(s, e) for s in range(len(offsets)) for e in range(s, min(s + 30, len(offsets)))
                 if context[offsets[s][0]:offsets[e][1]].strip()]
        s, e = max(spans, key=lambda span: float(start[span[0]] + end[span[1]]))
        results[qid] = context[offsets[s][0]:offsets[e][1]]
else:
    run = pipeline(kind, model=folder, trust_remote_code=True, device="cpu")
    results = [run(text, top_k=1)[0] if kind == "fill-mask" else run(text)[0] for text in inputs]
json.dump(results, open(request["out"], "w"))
"""


def run_pipeline(kind, folder, inputs, root, **extra):
    """The ``kind`` pipeline's results for ``inputs`` on the export ``folder``, from the transformers-only
    child."""
    request = dict(pipeline=kind, folder=str(folder), inputs=inputs, out=str(root / f"{kind}.json"), **extra)
    (root / f"{kind}-request.json").write_text(json.dumps(request))
    transformers_only(PIPELINES, root / f"{kind}-request.json", modules=root / "modules")
    return json.loads((root / f"{kind}.json").read_text())


def hub_of(checkpoint, data, sentencepiece_model):
    return TupeRobertaModel.from_pretrained(str(checkpoint.parent), checkpoint.name, str(data),
                                            sentencepiece_model=str(sentencepiece_model)).eval()


def real_lines(count):
    with open(test_data("wikitext-2", "wiki.valid.head.tokens"), encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and "<unk>" not in line
                and not line.strip().startswith("=")][:count]


def masked_texts():
    """The first words of lines of WikiText-2, one of them (the 4th, the 1st, the last) replaced by
    <mask>."""
    texts = []
    for i, line in enumerate(real_lines(9)):
        words = line.split()[:12]  # within the model's 96 positions
        place = (3, 0, len(words) - 1)[i % 3]
        texts.append(" ".join(words[:place] + ["<mask>"] + words[place + 1:]))
    return texts


def plugin_fill_mask(hub, text):
    """(id, probability) of the plugin's top prediction at the mask, text encoded as fairseq's fill_mask
    encodes it (the spans around <mask> each through sentencepiece)."""
    dictionary = hub.task.source_dictionary
    line = " <mask> ".join(hub.bpe.encode(span.rstrip()) for span in text.split("<mask>")).strip()
    tokens = dictionary.encode_line("<s> " + line, append_eos=True, add_if_not_exist=False).long()
    with torch.no_grad():
        logits = hub.model(tokens.unsqueeze(0))[0][0]
    probabilities = logits[tokens.tolist().index(dictionary.index("<mask>"))].softmax(-1)
    return int(probabilities.argmax()), float(probabilities.max())


def test_fill_mask_predicts_the_plugins_top_word_at_the_mask(whole_data_bin, tmp_path):  # noqa: F811
    checkpoint = make_checkpoint(whole_data_bin, tmp_path / "tupe_r.pt", "tupe_r_tiny", [], heads=False)
    folder = export(str(checkpoint), str(whole_data_bin), str(tmp_path / "export"))
    texts = masked_texts()
    results = run_pipeline("fill-mask", folder, texts, tmp_path)
    hub = hub_of(checkpoint, whole_data_bin, whole_data_bin / "sentencepiece.bpe.model")
    for text, result in zip(texts, results):
        token, probability = plugin_fill_mask(hub, text)
        assert result["token"] == token, text
        assert result["score"] == pytest.approx(probability, abs=1e-5)


def squad_slice(path):
    """Two paragraphs of the first article of SQuAD dev v1.1 (tests/data), as a SQuAD JSON."""
    with open(test_data("squad", "dev-v1.1.head.json"), encoding="utf-8") as f:
        article = json.load(f)["data"][0]
    data = [dict(article, paragraphs=article["paragraphs"][:2])]
    path.write_text(json.dumps({"version": "1.1", "data": data}), encoding="utf-8")
    return [(qa["id"], qa["question"], paragraph["context"]) for paragraph in article["paragraphs"][:2]
            for qa in paragraph["qas"]]


def test_question_answering_gives_the_span_tupe_evaluate_squad_predicts(whole_data_bin, tmp_path):  # noqa: F811
    questions = squad_slice(tmp_path / "dev.json")
    prepare_squad.main(["--valid-file", str(tmp_path / "dev.json"),
                        "--sentencepiece-model", str(whole_data_bin / "sentencepiece.bpe.model"),
                        "--dict", str(whole_data_bin / "dict.txt"), "--out", str(tmp_path / "squad-bin"),
                        "--max-seq-length", str(SQUAD_POSITIONS), "--doc-stride", "128",
                        "--max-query-length", "200"])
    checkpoint = make_checkpoint(tmp_path / "squad-bin", tmp_path / "squad.pt", "tupe_r_tiny", [],
                                 heads=False, task=["--task", "squad_span", "--criterion", "squad_span"],
                                 max_positions=SQUAD_POSITIONS)
    # every start and end a candidate (--n-best), as the pipeline's decoding
    evaluate_squad.main(["--path", str(checkpoint), "--data", str(tmp_path / "squad-bin"), "--gold-file",
                         str(tmp_path / "dev.json"), "--output", str(tmp_path / "predictions.json"), "--cpu",
                         "--n-best", str(SQUAD_POSITIONS)])
    predicted = json.loads((tmp_path / "predictions.json").read_text())
    folder = export(str(checkpoint), str(whole_data_bin), str(tmp_path / "export"))
    answers = run_pipeline("question-answering", folder, questions, tmp_path)
    assert set(predicted) == set(answers) and len(answers) > 10
    assert {qid: answer.strip() for qid, answer in answers.items()} == predicted


def test_text_classification_gives_the_plugins_label(whole_data_bin, tmp_path):  # noqa: F811
    prepare_glue.main(["--task", "SST-2", "--glue-dir", test_data("glue"),
                       "--sentencepiece-model", str(whole_data_bin / "sentencepiece.bpe.model"),
                       "--dict", str(whole_data_bin / "dict.txt"), "--out", str(tmp_path / "SST-2-bin")])
    checkpoint = make_checkpoint(tmp_path / "SST-2-bin", tmp_path / "sst2.pt", "tupe_r_tiny", [],
                                 heads=False, max_positions=GLUE_POSITIONS,
                                 task=["--task", "sentence_prediction", "--criterion", "sentence_prediction",
                                       "--num-classes", "2"])
    with open(test_data("glue", "SST-2", "dev.tsv"), encoding="utf-8") as f:
        sentences = [line.split("\t")[0].strip() for line in f][1:]
    folder = export(str(checkpoint), str(whole_data_bin), str(tmp_path / "export"))
    results = run_pipeline("text-classification", folder, sentences, tmp_path)
    hub = hub_of(checkpoint, tmp_path / "SST-2-bin", whole_data_bin / "sentencepiece.bpe.model")
    labels = hub.task.label_dictionary
    expected, scores = [], []
    with torch.no_grad():
        for sentence in sentences:
            probabilities = hub.predict("sentence_classification_head", hub.encode(sentence)).exp()[0]
            expected.append(labels.string([int(probabilities.argmax()) + labels.nspecial]))
            scores.append(float(probabilities.max()))
    assert [result["label"] for result in results] == expected and len(set(expected)) == 2
    assert [result["score"] for result in results] == pytest.approx(scores, abs=1e-5)
