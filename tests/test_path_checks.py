"""A path that exists but is a folder where a file is expected (or the reverse) is named as what it is,
in every tool's check, not reported missing."""

import types

import pytest

from tupe_plugin.user_input.path_checks import path_problem


def test_path_problem_says_what_the_path_is_instead(tmp_path):
    (tmp_path / "file.txt").write_text("x")
    assert path_problem(tmp_path / "file.txt") is None and path_problem(tmp_path, "folder") is None
    assert path_problem(tmp_path / "none.txt") == "no such file"
    assert path_problem(tmp_path / "none", "folder") == "no such folder"
    assert path_problem(tmp_path) == "a folder, not a file"
    assert path_problem(tmp_path / "file.txt", "folder") == "a file, not a folder"


def test_a_symlink_loop_and_a_broken_symlink_are_named_as_such(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "broken").symlink_to(tmp_path / "gone.pt")
    assert path_problem(tmp_path / "a") == "a symlink loop, not a file"
    assert path_problem(tmp_path / "broken") == f"a broken symlink (to the missing {tmp_path / 'gone.pt'})"


def study_config(folder):
    from tupe_plugin.study.config import load_config

    return load_config(str(folder), {"tupe_r_tiny"})


def study_corpus(folder):
    from tupe_plugin.study.config import check_config

    return check_config({"archs": ["tupe_r_tiny"], "corpus": str(folder)}, {"tupe_r_tiny"})


def unigram(folder):
    from tupe_plugin.study.unigram import main

    return main(["--train", str(folder), "--valid", str(folder), "--dict", str(folder), "--out", "x.json"])


def convert_official(folder):
    from tupe_plugin.conversion.cli import main

    return main(["--checkpoint", str(folder), "--dict", str(folder), "--out", str(folder / "out")])


def build_corpus(folder):
    from tupe_plugin.corpus.build import parse_args

    return parse_args(["--output-dir", str(folder / "out"), "--corpus", str(folder)])


def analysis_checkpoint(folder):
    from tupe_plugin.analysis.checkpoint import load_checkpoint

    return load_checkpoint(str(folder))


def embed_init_path(folder):
    from tupe_plugin.encoder.pretrained_embeddings import read_vectors

    return read_vectors(str(folder))


def init_from_checkpoint(folder):
    from tupe_plugin.models.checkpoint_init import check_exists

    return check_exists(str(folder))


def restore_file(folder):
    from tupe_plugin.policies.missing_restore_file import checkpoint_to_restore

    return checkpoint_to_restore(types.SimpleNamespace(restore_file=str(folder), save_dir=str(folder)))


def squad_gold_file(folder):
    from tupe_plugin.squad import evaluate

    return evaluate.main(["--gold-file", str(folder), "--predictions", str(folder)])


def glue_prepare(folder):
    from tupe_plugin.glue.prepare import task_files

    return task_files("RTE", str(folder), str(folder), str(folder))


@pytest.mark.parametrize("tool", [study_config, study_corpus, unigram, convert_official, build_corpus,
                                  analysis_checkpoint, embed_init_path, init_from_checkpoint, restore_file,
                                  squad_gold_file, glue_prepare])
def test_a_folder_where_a_file_is_expected_is_named_a_folder(tool, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises((SystemExit, Exception)) as caught:
        tool(tmp_path)
    message = str(caught.value) + capsys.readouterr().err
    assert "a folder, not a file" in message and "no such" not in message and "not exist" not in message


def test_a_file_given_as_tupe_convert_hf_model_folder_is_named_a_file(tmp_path, capsys):
    from tupe_plugin.conversion.hf_cli import main

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit):
        main(["--hf-model", str(tmp_path / "config.json"), "--out", str(tmp_path / "out")])
    assert f"--hf-model {tmp_path / 'config.json'}: a file, not a folder" in capsys.readouterr().err
