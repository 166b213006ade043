"""The deterministic split of SQuAD dev articles the study fine-tunes on when no train file is given."""

import json

from tupe_plugin.study.squad_split import main, split_articles


def article(i):
    return {"title": f"a{i}", "paragraphs": [{"context": "c", "qas": [{"id": f"q{i}", "question": "?",
                                                                        "answers": []}]}]}


def test_every_nth_article_is_dev_and_the_rest_train():
    train, dev = split_articles([article(i) for i in range(7)], dev_every=3)
    assert [a["title"] for a in dev] == ["a2", "a5"]
    assert [a["title"] for a in train] == ["a0", "a1", "a3", "a4", "a6"]


def test_split_cli_writes_both_halves_of_the_first_articles(tmp_path):
    (tmp_path / "dev.json").write_text(json.dumps({"version": "1.1", "data": [article(i) for i in range(9)]}))
    main(["--dev", str(tmp_path / "dev.json"), "--dev-every", "2", "--max-articles", "6",
          "--out", str(tmp_path / "split")])
    train = json.loads((tmp_path / "split" / "train.json").read_text())
    dev = json.loads((tmp_path / "split" / "dev.json").read_text())
    assert [a["title"] for a in train["data"]] == ["a0", "a2", "a4"]
    assert [a["title"] for a in dev["data"]] == ["a1", "a3", "a5"] and dev["version"] == "1.1"
