"""The analysis report's Kang et al. section: the build-time embedding diagnosis, on a checkpoint."""

import torch

from conftest import build_model, make_dictionary
from tupe_plugin.analysis.embedding_section import embeddings_vs_positions
from tupe_plugin.analysis.report import AnalysisContext, format_table, run_sections
from tupe_plugin.encoder.embedding_diagnosis import embedding_position_diagnosis


def context_for(arch, tmp_path):
    dictionary = make_dictionary()
    model = build_model(arch, dictionary).eval()
    return AnalysisContext(model, dictionary, arch, 12, str(tmp_path))


def test_section_reports_the_diagnosis_of_the_model_it_is_given(tmp_path):
    context = context_for("bert_a_tiny", tmp_path)
    with torch.no_grad():
        context.model.encoder.sentence_encoder.embed_tokens.weight.mul_(50)
    result = embeddings_vs_positions(context)
    expected = embedding_position_diagnosis(context.model, context.dictionary, seed=context.seed)
    assert result.applies and result.metrics == expected
    assert expected["ratio"] > 10


def test_printed_table_carries_the_ratio_and_the_probe(tmp_path):
    context = context_for("bert_a_tiny", tmp_path)
    table = format_table(run_sections(context, [embeddings_vs_positions]))
    ratio = embedding_position_diagnosis(context.model, context.dictionary)["ratio"]
    assert f"(ratio {ratio:.3g})" in table and "R^2" in table


def test_section_does_not_apply_without_absolute_positions(tmp_path):
    result = embeddings_vs_positions(context_for("bert_nope_tiny", tmp_path))
    assert not result.applies and "bert_nope_tiny" in result.reason
    assert "no absolute position" in result.reason
