"""--embed-init-path files with non-finite values, ragged lines or a wrong header are refused by line."""

import pytest
import torch
from conftest import build_model, make_dictionary

from tupe_plugin.encoder.pretrained_embeddings import read_checkpoint_vectors, read_text_vectors


def vectors_file(tmp_path, text):
    path = tmp_path / "vectors.txt"
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("text, line, token", [
    ("a 1 2\nb nan 4\n", 2, "b"),
    ("2 2\na inf 2\nb 3 4\n", 2, "a"),
    ("a 1 2\nb 3 4\nc 5 -inf\n", 3, "c"),
    ("a 1 2\nb 3 1e39\n", 2, "b"),  # overflows float32 to inf
])
def test_a_vector_with_nan_or_inf_is_refused_naming_its_line(text, line, token, tmp_path):
    with pytest.raises(ValueError, match=f"line {line}: the vector of '{token}' holds nan or inf values"):
        read_text_vectors(vectors_file(tmp_path, text))


@pytest.mark.parametrize("text, line, values, dim", [
    ("a 1 2\nb 3 4 5\n", 2, 3, 2),
    ("a 1 2 3\nb 1 2 3\nc 4 5 6 7 8\n", 3, 5, 3),
    ("a -1 2\nb -3 4 -5\n", 2, 3, 2),
])
def test_a_line_with_more_values_is_refused_not_read_as_a_token_with_spaces(text, line, values, dim,
                                                                            tmp_path):
    with pytest.raises(ValueError, match=f"line {line}: {values} values where the file's vectors have {dim}"):
        read_text_vectors(vectors_file(tmp_path, text))


def test_a_token_with_spaces_is_still_read(tmp_path):
    read = read_text_vectors(vectors_file(tmp_path, "a 1 2\n. . . 3 4\nat name@example.com 5 6\n"))
    assert read.tokens == ["a", ". . .", "at name@example.com"]


@pytest.mark.parametrize("text, values", [("2 5\na 1 2\nb 3 4\n", 2), ("2 2\na 1 2 3\nb 3 4 5\n", 3)])
def test_a_header_of_another_dimension_is_named_as_the_header(text, values, tmp_path):
    header = text.split("\n")[0]
    with pytest.raises(ValueError, match=rf"line 2: {values} values, but the header \(line 1: '{header}'\) "
                                         f"announces vectors of {header.split()[1]}"):
        read_text_vectors(vectors_file(tmp_path, text))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_checkpoint_with_non_finite_embeddings_is_refused(bad, tmp_path):
    dictionary = make_dictionary()
    model = build_model("bert_a_tiny", dictionary)
    state = model.state_dict()
    state["encoder.sentence_encoder.embed_tokens.weight"][7, 3] = bad
    torch.save({"model": state}, tmp_path / "model.pt")
    dictionary.save(str(tmp_path / "dict.txt"))
    with pytest.raises(ValueError,
                       match=r"1 rows of .*embed_tokens.weight hold nan or inf values \(first: row 7"):
        read_checkpoint_vectors(str(tmp_path / "model.pt"), str(tmp_path / "dict.txt"))
