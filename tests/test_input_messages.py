"""Bad model inputs are reported as what they are (an empty row, a negative id), not as another mistake."""

import pytest
from conftest import build_model, random_tokens


@pytest.mark.parametrize("bad", [-1, -7])
def test_a_negative_token_id_is_reported_as_itself(bad, dictionary):
    model = build_model("bert_a_tiny", dictionary)
    tokens = random_tokens(dictionary, [6, 6])
    tokens[1, 3] = bad
    with pytest.raises(ValueError, match=f"token id {bad} is outside the dictionary of {len(dictionary)} "
                                         rf"symbols \(ids 0..{len(dictionary) - 1}\)"):
        model(tokens)


def test_the_first_bad_id_is_named_when_several_are_wrong(dictionary):
    model = build_model("tupe_r_tiny", dictionary)
    tokens = random_tokens(dictionary, [6, 6])
    tokens[0, 2], tokens[1, 1] = len(dictionary) + 5, -2
    with pytest.raises(ValueError, match=f"token id {len(dictionary) + 5} is outside"):
        model(tokens)


@pytest.mark.parametrize("lengths, empty_row", [([5, 0], 1), ([0, 4, 3], 0)])
def test_an_all_padding_row_is_reported_as_empty_not_as_left_padding(lengths, empty_row, dictionary):
    model = build_model("tupe_r_tiny", dictionary)
    tokens = random_tokens(dictionary, [max(n, 1) for n in lengths])
    tokens[empty_row] = dictionary.pad()
    with pytest.raises(ValueError, match=f"row {empty_row} of the batch is all padding"):
        model(tokens)
