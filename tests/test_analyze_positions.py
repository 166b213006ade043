"""The position analysis: matrices against the papers' formulas, sections per architecture, the script."""

import json
import math

import pytest
import torch

from cli import run_fairseq, train_args
from conftest import PRESETS, build_model, make_dictionary
from paper_equations import content_free_correlation, deberta_position_terms, layer_norm
from tupe_plugin.analysis import cli as analyze_positions
from tupe_plugin.analysis import figures
from tupe_plugin.analysis import position_matrices as pm
from tupe_plugin.analysis.position_sections import POSITION_SECTIONS
from tupe_plugin.analysis.report import AnalysisContext, run_sections
from tupe_plugin.checkpoints.vocabulary import word_indices
from tupe_plugin.encoder.embedding_diagnosis import embedding_position_diagnosis

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SECTIONS_WITHOUT_FIGURE = {"embeddings_vs_positions"}  # numbers only: norms, their ratio, the probe R^2


def trained(model):
    """Move every parameter away from its initial value, as training would."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model


@pytest.mark.parametrize("preset", ["tupe_a", "tupe_r", "tupe_a_tie_cls", "bert_r"])
def test_content_free_term_is_tupe_v_ij_after_the_cls_reset(preset):
    model = trained(build_model(f"{preset}_tiny"))
    term = pm.content_free_term(model, 10)
    encoder = pm.positional_encoder(model)
    for head in range(term.size(0)):
        torch.testing.assert_close(term[head], content_free_correlation(encoder, 10, head),
                                   atol=1e-5, rtol=1e-5)


def test_content_free_term_of_bert_a_d_is_its_position_to_position_term():
    model = trained(build_model("bert_a_d_tiny"))
    untied = pm.positional_encoder(model).positional_term.untied_position
    p = layer_norm(untied.embed_positions.weight[:10], untied.layer_norm)
    term = pm.content_free_term(model, 10)
    for head in range(4):
        rows = slice(32 * head, 32 * (head + 1))
        expected = (p @ untied.q_proj.weight[rows].t()) @ (p @ untied.k_proj.weight[rows].t()).t()
        torch.testing.assert_close(term[head], expected / math.sqrt(4 * 32), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("preset", ["tupe_a", "tupe_r"])
def test_released_semantics_positions_are_rows_1_to_t_of_the_untied_table(preset):
    model = trained(build_model(f"{preset}_tiny", cls_reset="release", untied_proj_bias=True))
    untied = pm.positional_encoder(model).positional_term.untied_position
    kind, vectors = pm.absolute_position_vectors(model, 10)
    assert kind == "untied"
    expected = layer_norm(untied.embed_positions.weight[1:11], untied.layer_norm)
    torch.testing.assert_close(vectors, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("preset", ["tupe_a", "tupe_r"])
def test_released_semantics_diagnosis_counts_max_positions(preset):
    model = trained(build_model(f"{preset}_tiny", cls_reset="release", untied_proj_bias=True,
                                max_positions=24))
    diagnosis = embedding_position_diagnosis(model)
    assert diagnosis["num_positions"] == 24


@pytest.mark.parametrize("cls_reset", ["paper", "release"])
def test_t5_bias_by_distance_is_the_bias_of_ordinary_pairs(cls_reset):
    model = trained(build_model("tupe_r_tiny", cls_reset=cls_reset, untied_proj_bias=cls_reset == "release"))
    bias = pm.positional_encoder(model).positional_term.relative_bias
    offsets, per_offset = pm.relative_bias_by_distance(model, 12)
    with torch.no_grad():
        dense = bias(12)
    for i in range(1, 12):
        for j in range(1, 12):
            column = int((offsets == j - i).nonzero())
            torch.testing.assert_close(per_offset[:, column], dense[:, i, j].float())


def test_deberta_profiles_of_the_first_layer_average_the_paper_twins_terms_per_offset():
    dictionary = make_dictionary()
    model = trained(build_model("deberta_tiny", dictionary)).eval()
    offsets, profiles = pm.disentangled_profiles(model, dictionary, 8, samples=3, seed=2)
    words = torch.tensor(word_indices(dictionary))[
        torch.randint(len(word_indices(dictionary)), (3, 8), generator=torch.Generator().manual_seed(2))]
    encoder = pm.positional_encoder(model)
    layer = encoder.layers[0]
    w, b = layer.self_attn.in_proj.weight, layer.self_attn.in_proj.bias
    with torch.no_grad():
        x = layer_norm(encoder.embed_tokens.weight[words], encoder.layernorm_embedding)
        for head in range(4):
            q_rows, k_rows = slice(32 * head, 32 * head + 32), slice(128 + 32 * head, 160 + 32 * head)
            terms = deberta_position_terms(encoder, layer, x @ w[q_rows].t() + b[q_rows],
                                           x @ w[k_rows].t() + b[k_rows], head).mean(0) / math.sqrt(3 * 32)
            for column, offset in enumerate(offsets.tolist()):
                pairs = [terms[i, i + offset] for i in range(8) if 0 <= i + offset < 8]
                torch.testing.assert_close(profiles[0, :, head, column].sum(), torch.stack(pairs).mean(),
                                           atol=1e-5, rtol=1e-5)


def test_first_layer_position_correlation_is_wang_et_al_fig_7():
    model = trained(build_model("bert_a_tiny"))
    encoder = pm.positional_encoder(model)
    positions = encoder.embed_positions.weight[:10]
    weight = encoder.layers[0].self_attn.in_proj.weight
    correlation = pm.first_layer_position_correlation(model, 10)
    for head in range(4):
        w_q, w_k = weight[32 * head: 32 * (head + 1)], weight[128 + 32 * head: 128 + 32 * (head + 1)]
        expected = (positions @ w_q.t()) @ (positions @ w_k.t()).t() / math.sqrt(32)
        torch.testing.assert_close(correlation[head], expected, atol=1e-5, rtol=1e-5)


def test_identical_word_probing_averages_eq_5_over_words():
    dictionary = make_dictionary()
    model = trained(build_model("bert_a_tiny", dictionary))
    probed = pm.identical_word_attention(model, dictionary, 9, samples=6, seed=5)
    words = torch.tensor(word_indices(dictionary))[
        torch.randint(len(word_indices(dictionary)), (6,),
                      generator=torch.Generator().manual_seed(5))
    ]
    encoder = pm.positional_encoder(model)
    attention = encoder.layers[0].self_attn
    w, b = attention.in_proj.weight, attention.in_proj.bias
    expected = torch.zeros(4, 9, 9)
    with torch.no_grad():
        for word in words:
            x = layer_norm(encoder.embed_tokens.weight[word] + encoder.embed_positions.weight[:9],
                           encoder.layernorm_embedding)
            for head in range(4):
                q_rows, k_rows = slice(32 * head, 32 * head + 32), slice(128 + 32 * head, 160 + 32 * head)
                q, k = x @ w[q_rows].t() + b[q_rows], x @ w[k_rows].t() + b[k_rows]
                expected[head] += torch.softmax(q @ k.t() / math.sqrt(32), -1) / 6
    torch.testing.assert_close(probed, expected, atol=1e-5, rtol=1e-5)


def expected_sections(config):
    """The sections that apply to a model of the position config ``config``, from the registry's facts of
    the encodings it uses: their kind, the name of an encoding that has a section of its own, and the
    value its flag selects."""
    used = config.encodings()
    kinds, names = {encoding.kind for encoding in used}, {encoding.name for encoding in used}
    # the values of the family flags that select them (a switch of its own, --dape, is a bool)
    selected = [getattr(config, encoding.family) for encoding in used if encoding.selects is None]
    applies = {
        # a term of the positions alone: the untied term and every bias (relative vectors depend on the query)
        "content_free_term": bool(kinds & {"untied", "bias", "distance_bias"}),
        "disentangled_profiles": "deberta" in names,
        "t5_bias": "t5" in names,
        "alibi_bias": "alibi" in names,
        "distance_bias": "distance_bias" in kinds and "alibi" not in names,  # ALiBi has its own section
        "rotary_profile": "rotation" in kinds,
        "first_layer_position_correlation": "absolute" in kinds,
        "absolute_position_dot_products": bool(kinds & {"absolute", "untied"}),
        "relative_position_dot_products": "shaw" in names,
        "identical_word_probing": True,
        "learned_frequencies": any("learnable" in value for value in selected),
    }
    return {name for name, yes in applies.items() if yes}


@pytest.fixture
def no_drawing(monkeypatch):
    """Sections run without rendering (the figures are checked end to end below)."""
    monkeypatch.setattr(figures, "draw", lambda *args, **kwargs: ("not drawn", ""))


@pytest.mark.parametrize("preset", PRESETS)
def test_sections_apply_exactly_where_the_position_flags_say(preset, tmp_path, no_drawing):
    dictionary = make_dictionary()
    model = build_model(f"{preset}_tiny", dictionary).eval()
    context = AnalysisContext(model, dictionary, f"{preset}_tiny", 12, str(tmp_path), window=4,
                              probe_samples=2)
    results = run_sections(context, POSITION_SECTIONS)
    assert {r.name for r in results if r.applies} == expected_sections(pm.position_config(model))
    for result in results:
        if result.applies:
            assert result.figures and all(
                math.isfinite(value) for row in result.rows for key, value in row.items()
                if key != "label"
            )
        else:
            assert f"{preset}_tiny" in result.reason and "--abs-pos" in result.reason


def test_alibi_section_reports_the_papers_slopes(tmp_path, no_drawing):
    dictionary = make_dictionary()
    model = build_model("bert_alibi_tiny", dictionary).eval()
    context = AnalysisContext(model, dictionary, "bert_alibi_tiny", 12, str(tmp_path), window=4)
    result = next(r for r in run_sections(context, POSITION_SECTIONS) if r.name == "alibi_bias")
    forward = [head["bias_forward"] for head in result.metrics["heads"]]
    for head, slope in enumerate([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8]):
        assert forward[head] == pytest.approx([-slope * m for m in range(12)])


def test_rotary_profile_is_one_at_offset_zero_and_symmetric(tmp_path, no_drawing):
    dictionary = make_dictionary()
    model = build_model("bert_rope_tiny", dictionary).eval()
    matrix = pm.rotary_offset_matrix(model, 16)
    torch.testing.assert_close(torch.diagonal(matrix), torch.ones(16, dtype=torch.float64))
    torch.testing.assert_close(matrix, matrix.t())
    context = AnalysisContext(model, dictionary, "bert_rope_tiny", 16, str(tmp_path), window=4)
    result = next(r for r in run_sections(context, POSITION_SECTIONS) if r.name == "rotary_profile")
    properties = result.metrics["properties"]
    assert properties["symmetry_violation"] == pytest.approx(0.0, abs=1e-9)
    assert properties["translation_invariance_violation"] == pytest.approx(0.0, abs=1e-9)


def test_learned_rotary_frequencies_are_compared_with_their_initial_values(tmp_path, no_drawing):
    dictionary = make_dictionary()
    model = build_model("bert_lrope_tiny", dictionary, rotary_base=100.0)
    frequencies = pm.positional_encoder(model).positional_term.rotary.sinusoid.frequencies
    with torch.no_grad():
        frequencies.mul_(2.0)
    context = AnalysisContext(model, dictionary, "bert_lrope_tiny", 16, str(tmp_path))
    result = next(r for r in run_sections(context, POSITION_SECTIONS) if r.name == "learned_frequencies")
    assert result.metrics["RoPE"]["mean_relative_change"] == pytest.approx(1.0, rel=1e-5)


def test_learned_frequencies_are_compared_with_their_initial_values(tmp_path, no_drawing):
    dictionary = make_dictionary()
    model = build_model("bert_lsin_ape_tiny", dictionary)
    frequencies = pm.positional_encoder(model).embed_positions.sinusoid.frequencies
    with torch.no_grad():
        frequencies.mul_(1.5)
    context = AnalysisContext(model, dictionary, "bert_lsin_ape_tiny", 32, str(tmp_path))
    result = next(r for r in run_sections(context, POSITION_SECTIONS) if r.name == "learned_frequencies")
    assert result.metrics["APE"]["mean_relative_change"] == pytest.approx(0.5, rel=1e-5)
    assert result.metrics["APE"]["learned"] == pytest.approx((frequencies.detach()).tolist())


@pytest.fixture(scope="module")
def checkpoint(wikitext_bin, tmp_path_factory):
    """checkpoint(arch): a checkpoint of ``arch`` after one fairseq-train update, trained once."""
    saved = {}

    def train(arch):
        if arch not in saved:
            save_dir = tmp_path_factory.mktemp(arch)
            run_fairseq("train", *train_args(wikitext_bin, save_dir, arch, 1))
            saved[arch] = save_dir / "checkpoint_last.pt"
        return saved[arch]

    return train


def run_script(*argv):
    return analyze_positions.main([str(a) for a in argv])


@pytest.mark.parametrize("arch, not_applicable", [
    ("tupe_r_tiny", {"first_layer_position_correlation", "relative_position_dot_products",
                     "learned_frequencies", "alibi_bias", "distance_bias", "rotary_profile",
                     "disentangled_profiles"}),
    # DAPE on KERPLE: the content-free sections draw KERPLE's bias B, which its MLP reads with the logits
    ("bert_dape_kerple_tiny", {"first_layer_position_correlation", "absolute_position_dot_products",
                               "relative_position_dot_products", "learned_frequencies", "t5_bias",
                               "alibi_bias", "rotary_profile", "disentangled_profiles",
                               "embeddings_vs_positions"}),
    pytest.param("bert_lsin_ape_lsin_rpe_tiny", {"content_free_term", "t5_bias", "alibi_bias",
                                                 "distance_bias", "rotary_profile", "disentangled_profiles"},
                 marks=pytest.mark.slow),
])
def test_script_writes_figures_json_and_table_for_a_trained_checkpoint(
    checkpoint, wikitext_bin, tmp_path, capsys, arch, not_applicable
):
    out = tmp_path / "analysis"
    run_script("--path", checkpoint(arch), "--data", wikitext_bin, "--out", out,
               "--max-positions", 24, "--probe-samples", 4)
    report = json.loads((out / "positions.json").read_text())
    sections = report["sections"]
    assert {name for name, s in sections.items() if not s["applies"]} == not_applicable
    for name, section in sections.items():
        if section["applies"] and name in SECTIONS_WITHOUT_FIGURE:
            assert section["figures"] == [] and section["summary"]
        elif section["applies"]:
            assert section["figures"] == [str(out / f"{name}.png")]
            assert (out / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
        else:
            assert not (out / f"{name}.png").exists() and section["reason"]
    table = capsys.readouterr().out
    (left_out,) = [line for line in table.splitlines() if line.startswith("not applicable")]
    assert set(left_out.split(": ", 1)[1].split(", ")) == not_applicable
    assert not any(line.startswith(f"{name}:") for name in not_applicable for line in table.splitlines())
    assert report["arch"] == arch and report["positions"] == 24


def test_the_content_free_term_of_a_model_with_layer_terms_says_what_it_does_not_draw(dictionary, tmp_path):
    model = build_model("bert_dape_alibi_tiny", dictionary)
    context = AnalysisContext(model, dictionary, "bert_dape_alibi_tiny", 16, str(tmp_path))
    result = next(r for r in run_sections(context, POSITION_SECTIONS) if r.name == "content_free_term")
    assert result.applies
    assert result.title.endswith("not drawn: the term each layer computes from its own logits (DAPE), of the "
                                 "content")


def test_script_refuses_more_positions_than_the_learned_table(checkpoint, wikitext_bin, tmp_path, capsys):
    with pytest.raises(SystemExit):
        run_script("--path", checkpoint("tupe_r_tiny"), "--data", wikitext_bin,
                   "--out", tmp_path, "--max-positions", 1000)
    assert "--max-positions 1000 exceeds the 64 positions" in capsys.readouterr().err


def test_script_names_a_missing_data_directory(checkpoint, tmp_path, capsys):
    with pytest.raises(SystemExit):
        run_script("--path", checkpoint("tupe_r_tiny"), "--data", tmp_path / "nowhere",
                   "--out", tmp_path)
    assert "--data" in capsys.readouterr().err


def test_script_names_a_missing_checkpoint(tmp_path, capsys):
    with pytest.raises(SystemExit):
        run_script("--path", tmp_path / "missing.pt", "--out", tmp_path)
    error = capsys.readouterr().err
    assert "--path" in error and "missing.pt" in error


def test_distance_bias_section_reports_kerples_learned_bias(tmp_path, no_drawing):
    dictionary = make_dictionary()
    model = build_model("bert_kerple_tiny", dictionary).eval()
    bias = pm.positional_encoder(model).positional_term.relative_bias
    with torch.no_grad():
        bias.r2.copy_(torch.tensor([0.5, 1.0, 2.0, 3.0]))
    context = AnalysisContext(model, dictionary, "bert_kerple_tiny", 12, str(tmp_path), window=4)
    result = next(r for r in run_sections(context, POSITION_SECTIONS) if r.name == "distance_bias")
    r1, r2 = (r.detach() for r in bias.coefficients())
    for head, metrics in enumerate(result.metrics["heads"]):
        expected = [-(r1[head] * math.log1p(r2[head] * m)).item() for m in range(12)]
        assert metrics["bias_forward"] == pytest.approx(expected, rel=1e-5)
        assert metrics["bias_backward"] == pytest.approx(expected, rel=1e-5)
