"""The context-free baseline of the study report: unigram cross-entropy, bits per token."""

import json
import math

import pytest

from tupe_plugin.study.unigram import main, read_dictionary, unigram_cross_entropy


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "train.bpe").write_text("a b\na\n", encoding="utf-8")
    (tmp_path / "valid.bpe").write_text("a c\n", encoding="utf-8")
    (tmp_path / "dict.txt").write_text("a 2\nb 1\n", encoding="utf-8")
    return tmp_path


def test_unigram_cross_entropy_matches_the_hand_computed_value(tiny):
    # train tokens a b </s> a </s>: N = 5, counts a 2, b 1, </s> 2; V = {a, b, </s>, <unk>} = 4.
    # valid tokens a <unk>(c) </s>: p = 3/9, 1/9, 3/9, so H = (log2 3 + log2 9 + log2 3) / 3 = (4/3) log2 3.
    result = unigram_cross_entropy(tiny / "train.bpe", tiny / "valid.bpe", read_dictionary(tiny / "dict.txt"))
    assert result["bits_per_token"] == pytest.approx(4 / 3 * math.log2(3), abs=1e-12)
    assert (result["train_tokens"], result["valid_tokens"], result["vocabulary"]) == (5, 3, 4)


def test_unigram_cli_writes_json(tiny):
    main(["--train", str(tiny / "train.bpe"), "--valid", str(tiny / "valid.bpe"),
          "--dict", str(tiny / "dict.txt"), "--out", str(tiny / "out" / "unigram.json")])
    written = json.loads((tiny / "out" / "unigram.json").read_text())
    assert written["bits_per_token"] == pytest.approx(4 / 3 * math.log2(3), abs=1e-12)


def test_malformed_dictionary_line_is_named(tiny):
    (tiny / "dict.txt").write_text("a 2\nbroken\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"dict.txt:2: not a fairseq dictionary line"):
        read_dictionary(tiny / "dict.txt")
