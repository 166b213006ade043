"""--embed-init-*: reading, matching, standardising (Kang et al.), and the embeddings-vs-positions
diagnosis."""

import argparse
import math

import pytest
import torch
from cli import run_fairseq, train_args
from conftest import build_model, make_dictionary
from fairseq.data import Dictionary

from tupe_plugin.analysis import export_embeddings
from tupe_plugin.encoder.embedding_diagnosis import embedding_position_diagnosis, position_probe_r2
from tupe_plugin.encoder.pretrained_embeddings import (
    FAIRSEQ_EMBED_INIT_STD,
    initialize_embeddings,
    match_tokens,
    read_checkpoint_vectors,
    read_text_vectors,
    read_vectors,
)


def write_vectors(path, tokens, vectors, header=True):
    lines = [f"{len(tokens)} {vectors.size(1)}"] if header else []
    lines += [t + " " + " ".join(repr(v) for v in row) for t, row in zip(tokens, vectors.tolist())]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def init_args(path, standardize="none", **flags):
    return argparse.Namespace(
        embed_init_path=str(path), embed_init_standardize=standardize, **flags
    )


@pytest.fixture
def model(dictionary):
    return build_model("bert_a_tiny", dictionary)


@pytest.fixture
def file_vectors(dictionary, tmp_path):
    """Wide vectors (std 0.5, mean 1) for the ten symbols w0..w9 of the test dictionary."""
    tokens = [f"w{i}" for i in range(10)]
    vectors = torch.randn(10, 128) * 0.5 + 1.0
    return tokens, vectors, write_vectors(tmp_path / "vectors.txt", tokens, vectors)


def matched_rows(dictionary, tokens):
    return torch.tensor([dictionary.index(t) for t in tokens])


@pytest.mark.parametrize("header", [True, False])
def test_text_vectors_are_read_with_or_without_header(tmp_path, header):
    vectors = torch.tensor([[0.5, -1.0, 2.0], [1e-3, 4.0, -7.25]])
    path = write_vectors(tmp_path / "v.txt", ["the", "▁cat"], vectors, header=header)
    read = read_vectors(str(path))
    assert read.tokens == ["the", "▁cat"]
    assert torch.equal(read.vectors, vectors)


def test_header_announcing_more_vectors_than_the_file_has_is_refused(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("3 2\na 1 2\nb 3 4\n", encoding="utf-8")
    with pytest.raises(ValueError, match="header announces 3 vectors but the file has 2"):
        read_text_vectors(str(path))


def test_a_line_with_too_few_values_is_refused_with_its_number(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("a 1 2 3\nb 3 4\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: 2 values where the file's vectors have 3"):
        read_text_vectors(str(path))


def test_a_binary_file_is_refused_clearly(tmp_path):
    path = tmp_path / "vectors.bin"
    path.write_bytes(b"2 3\nthe \x00\x00\x80?\x00\x00\x00@\n")
    with pytest.raises(ValueError, match=r"--embed-init-path .*vectors.bin: a binary file"):
        read_vectors(str(path))


def test_a_file_that_is_not_utf8_is_refused_clearly(tmp_path):
    path = tmp_path / "vectors.txt"
    path.write_bytes(b"caf\xe9 1.0 2.0\n")
    with pytest.raises(ValueError, match="--embed-init-path .*not UTF-8"):
        read_vectors(str(path))


def test_checkpoint_vectors_are_read_with_the_dictionary_next_to_it(model, dictionary, tmp_path):
    dictionary.save(str(tmp_path / "dict.txt"))
    torch.save({"args": None, "cfg": {"task": {"data": None}}, "model": model.state_dict()},
               tmp_path / "checkpoint.pt")
    read = read_vectors(str(tmp_path / "checkpoint.pt"))
    assert read.tokens == dictionary.symbols
    assert torch.equal(read.vectors, model.encoder.sentence_encoder.embed_tokens.weight)


def test_export_embeddings_writes_what_embed_init_path_reads(model, dictionary, tmp_path):
    dictionary.save(str(tmp_path / "dict.txt"))
    torch.save({"args": None, "model": model.state_dict()}, tmp_path / "checkpoint.pt")
    export_embeddings.main([str(tmp_path / "checkpoint.pt"), "--out", str(tmp_path / "v.txt"),
                            "--scale", "2"])
    read = read_vectors(str(tmp_path / "v.txt"))
    assert read.tokens == dictionary.symbols
    torch.testing.assert_close(read.vectors, 2 * model.encoder.sentence_encoder.embed_tokens.weight,
                               rtol=1e-7, atol=1e-9)


def test_checkpoint_without_a_dictionary_asks_for_embed_init_dict(model, tmp_path):
    torch.save({"args": None, "model": model.state_dict()}, tmp_path / "checkpoint.pt")
    with pytest.raises(FileNotFoundError, match="pass --embed-init-dict"):
        read_checkpoint_vectors(str(tmp_path / "checkpoint.pt"))


def test_none_copies_the_file_vectors_and_keeps_the_other_rows(model, dictionary, file_vectors):
    tokens, vectors, path = file_vectors
    weight = model.encoder.sentence_encoder.embed_tokens.weight
    before = weight.detach().clone()
    counts = initialize_embeddings(model.encoder.sentence_encoder.embed_tokens, dictionary,
                                   init_args(path))
    rows = matched_rows(dictionary, tokens)
    assert torch.equal(weight[rows], vectors)
    others = torch.ones(len(dictionary), dtype=torch.bool)
    others[rows] = False
    assert torch.equal(weight[others], before[others])
    assert counts == {"exact": 10, "fallback": 0, "unmatched": len(dictionary) - 1 - 10}


def test_fairseq_initialises_embeddings_with_the_std_that_std_standardises_to():
    weight = build_model("bert_a_tiny", make_dictionary(400)).encoder.sentence_encoder.embed_tokens.weight
    assert weight[4:].std().item() == pytest.approx(FAIRSEQ_EMBED_INIT_STD, rel=0.02)
    assert FAIRSEQ_EMBED_INIT_STD == 0.02


def test_std_gives_the_matched_rows_zero_mean_and_the_init_std(model, dictionary, file_vectors):
    tokens, vectors, path = file_vectors
    initialize_embeddings(model.encoder.sentence_encoder.embed_tokens, dictionary, init_args(path, "std"))
    rows = model.encoder.sentence_encoder.embed_tokens.weight[matched_rows(dictionary, tokens)]
    assert rows.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert rows.std(unbiased=False).item() == pytest.approx(0.02, rel=1e-5)
    expected = (vectors - vectors.mean()) / vectors.std(unbiased=False) * 0.02
    torch.testing.assert_close(rows, expected)


def test_xavier_maps_the_matched_rows_onto_the_xavier_uniform_range(model, dictionary, file_vectors):
    tokens, vectors, path = file_vectors
    initialize_embeddings(model.encoder.sentence_encoder.embed_tokens, dictionary,
                          init_args(path, "xavier"))
    rows = model.encoder.sentence_encoder.embed_tokens.weight[matched_rows(dictionary, tokens)]
    bound = math.sqrt(6 / (len(dictionary) + 128))  # fan_in = dim 128, fan_out = vocabulary
    assert rows.min().item() == pytest.approx(-bound, rel=1e-6)
    assert rows.max().item() == pytest.approx(bound, rel=1e-6)
    expected = -bound + 2 * bound * (vectors - vectors.min()) / (vectors.max() - vectors.min())
    torch.testing.assert_close(rows, expected)


def test_coverage_counts_exact_and_fallback_matches():
    dictionary = Dictionary()
    for symbol in ["cat", "The", "▁dog", "Bird", "zebra"]:
        dictionary.add_symbol(symbol)
    tokens = ["cat", "the", "dog", "▁bird", "▁Bird", "emu"]
    rows, file_rows, counts = match_tokens(dictionary.symbols, tokens, skip={dictionary.pad()})
    # <s>, </s>, <unk> and zebra are not in the file; <pad> is never matched
    assert counts == {"exact": 1, "fallback": 3, "unmatched": 4}
    index = dictionary.index
    assert dict(zip(rows, file_rows)) == {index("cat"): 0, index("The"): 1, index("▁dog"): 2,
                                          index("Bird"): 3}


def test_fallback_rows_get_the_vector_of_their_match(tmp_path):
    dictionary = Dictionary()
    dictionary.add_symbol("▁The")
    vectors = torch.randn(1, 128)
    path = write_vectors(tmp_path / "v.txt", ["the"], vectors)
    model = build_model("bert_a_tiny", dictionary)
    embed = model.encoder.sentence_encoder.embed_tokens
    counts = initialize_embeddings(embed, dictionary, init_args(path))
    assert counts["fallback"] == 1
    assert torch.equal(embed.weight[dictionary.index("▁The")], vectors[0])


def test_a_size_mismatch_names_the_flag_and_both_sizes(model, dictionary, tmp_path):
    path = write_vectors(tmp_path / "v.txt", ["w1"], torch.randn(1, 50))
    with pytest.raises(ValueError, match=r"--embed-init-path .* 50-dimensional .* 128-dimensional"
                                         r" \(--encoder-embed-dim\).*--embed-init-project"):
        initialize_embeddings(model.encoder.sentence_encoder.embed_tokens, dictionary,
                              init_args(path, embed_init_project="none"))


def test_pca_projection_keeps_distances_of_vectors_in_a_small_subspace(model, dictionary, tmp_path):
    tokens = [f"w{i}" for i in range(30)]
    vectors = torch.randn(30, 6) @ torch.randn(6, 200)  # rank 6 in 200 dimensions
    path = write_vectors(tmp_path / "v.txt", tokens, vectors)
    embed = model.encoder.sentence_encoder.embed_tokens
    initialize_embeddings(embed, dictionary, init_args(path, embed_init_project="pca"))
    rows = embed.weight[matched_rows(dictionary, tokens)]
    def distances(x):
        return (x[:, None] - x[None]).norm(dim=-1)

    torch.testing.assert_close(distances(rows), distances(vectors), rtol=1e-4, atol=1e-3)


def test_no_matching_token_is_refused(model, dictionary, tmp_path):
    path = write_vectors(tmp_path / "v.txt", ["unrelated"], torch.randn(1, 128))
    with pytest.raises(ValueError, match="none of its 1 tokens matches"):
        initialize_embeddings(model.encoder.sentence_encoder.embed_tokens, dictionary,
                              init_args(path))


def test_the_flags_initialise_a_new_model_but_not_one_rebuilt_from_its_config(dictionary, tmp_path):
    tokens = [f"w{i}" for i in range(10)]
    vectors = torch.randn(10, 128)
    path = write_vectors(tmp_path / "v.txt", tokens, vectors)
    model = build_model("bert_a_tiny", dictionary, embed_init_path=str(path))
    weight = model.encoder.sentence_encoder.embed_tokens.weight
    assert torch.equal(weight[matched_rows(dictionary, tokens)], vectors)
    assert model.args.embed_init_applied
    path.unlink()  # a saved config must not need the file to load its weights
    saved = {k: v for k, v in vars(model.args).items() if k not in ("arch", "max_positions")}
    rebuilt = build_model("bert_a_tiny", dictionary, **saved)
    assert not torch.equal(rebuilt.encoder.sentence_encoder.embed_tokens.weight[4], vectors[0])


def set_rows(weight, row):
    with torch.no_grad():
        weight.copy_(torch.as_tensor(row).expand_as(weight))


def test_absorption_ratio_of_a_constructed_model(dictionary):
    model = build_model("bert_a_tiny", dictionary)
    encoder = model.encoder.sentence_encoder
    word = torch.zeros(128)
    word[:2] = torch.tensor([3.0, 4.0])  # norm 5
    position = torch.zeros(128)
    position[5:7] = torch.tensor([0.3, 0.4])  # norm 0.5
    set_rows(encoder.embed_tokens.weight, word)
    set_rows(encoder.embed_positions.weight, position)
    with torch.no_grad():
        encoder.embed_tokens.weight[dictionary.pad()] = 100.0  # excluded
        encoder.embed_tokens.weight[dictionary.bos()] = 100.0  # excluded with the dictionary
    result = embedding_position_diagnosis(model, dictionary)
    assert result["position_input"] == "added"
    assert result["word_norm"] == pytest.approx(5.0)
    assert result["position_norm"] == pytest.approx(0.5)
    assert result["ratio"] == pytest.approx(10.0)
    assert result["num_positions"] == 32


def test_absorption_ratio_against_fixed_sinusoids_of_norm_sqrt_half_d(dictionary):
    model = build_model("bert_sin_ape_tiny", dictionary)
    set_rows(model.encoder.sentence_encoder.embed_tokens.weight, torch.full((128,), 0.25))  # norm 2√2
    result = embedding_position_diagnosis(model, dictionary)
    # each of the 64 (sin, cos) pairs has squared norm 1: |P(t)| = √64 = 8
    assert result["position_norm"] == pytest.approx(8.0, rel=1e-5)
    assert result["ratio"] == pytest.approx(2 * math.sqrt(2) / 8, rel=1e-5)


def test_untied_positions_are_reported_without_ratio_or_probe(dictionary):
    model = build_model("tupe_a_tiny", dictionary)
    result = embedding_position_diagnosis(model, dictionary)
    assert result["position_input"] == "untied"
    table = model.encoder.sentence_encoder.positional_term.untied_position.embed_positions.weight
    variance = table.var(dim=-1, unbiased=False)
    # LayerNorm at init (weight 1, bias 0, eps 1e-5): |p_t| = √(d · var / (var + eps))
    expected = (128 * variance / (variance + 1e-5)).sqrt().mean().item()
    assert result["position_norm"] == pytest.approx(expected, rel=1e-5)
    assert result["ratio"] is None and result["probe_r2"] is None


def test_no_absolute_position_is_reported_as_none(dictionary):
    result = embedding_position_diagnosis(build_model("bert_rpe_tiny", dictionary), dictionary)
    assert result["position_input"] == "none"
    assert result["position_norm"] is None and result["ratio"] is None


def test_probe_recovers_positions_that_dominate_the_input():
    positions = torch.randn(32, 128) * 0.02
    assert position_probe_r2(torch.randn(500, 128) * 1e-4, positions) > 0.99


def test_probe_fails_when_the_word_embeddings_are_huge():
    positions = torch.randn(32, 128) * 0.02
    assert position_probe_r2(torch.randn(500, 128) * 20.0, positions) < 0.05


def test_diagnosis_probe_falls_as_the_pretrained_scale_grows(dictionary, file_vectors):
    _, _, path = file_vectors
    scores = []
    for standardize in ("std", "none"):
        model = build_model("bert_a_tiny", dictionary, embed_init_path=str(path),
                            embed_init_standardize=standardize)
        scores.append(embedding_position_diagnosis(model, dictionary)["probe_r2"])
    assert scores[0] > scores[1] + 0.3


def embedding_of(checkpoint):
    state = torch.load(checkpoint, map_location="cpu")
    return state["model"]["encoder.sentence_encoder.embed_tokens.weight"]


def test_fairseq_train_initialises_and_resuming_keeps_the_checkpoint_weights(wikitext_bin, tmp_path):
    symbols = Dictionary.load(str(wikitext_bin / "dict.txt")).symbols[4:54]
    vectors = torch.randn(len(symbols), 128) + 3.0
    path = write_vectors(tmp_path / "vectors.txt", symbols, vectors)
    save_dir = tmp_path / "checkpoints"
    command = train_args(wikitext_bin, save_dir, "bert_a_tiny", 1, "--embed-init-path", path)
    output = run_fairseq("train", *command)
    assert "(exact 50, fallback " in output  # fallback: other casings of the same words
    trained = embedding_of(save_dir / "checkpoint_last.pt")[4:54]
    assert (trained - vectors).abs().max() < 5e-3  # one Adam step of lr 1e-3 from the file's vectors

    write_vectors(path, symbols, -vectors)  # resuming must not read these
    command[command.index("--max-update") + 1] = 2
    output = run_fairseq("train", *command)
    assert "(epoch 1 @ 1 updates" in output
    assert "the loaded checkpoint's weights replace the --embed-init-path initialisation" in output
    resumed = embedding_of(save_dir / "checkpoint_last.pt")[4:54]
    assert (resumed - vectors).abs().max() < 1e-2

    exported = read_checkpoint_vectors(str(save_dir / "checkpoint_last.pt"))  # dict.txt of task.data
    assert exported.tokens[4:54] == symbols and exported.tokens[-1] == "<mask>"

    path.unlink()  # validating never needs the vectors
    output = run_fairseq("validate", wikitext_bin, "--user-dir", "tupe_plugin", "--path",
                         save_dir / "checkpoint_last.pt", "--task", "masked_lm", "--batch-size", 8,
                         "--cpu", "--num-workers", 0)
    assert "valid on 'valid' subset" in output
