"""scripts/study.py's config checks: a bad config stops before any job, naming the key and the fix."""

import os

import pytest
import yaml

from tupe_plugin.study.cli import known_archs, main
from tupe_plugin.study.config import StudyConfigError, load_config

from conftest import SHARED_DATA

GLUE_DIR = os.path.join(SHARED_DATA, "glue")


@pytest.fixture(scope="module")
def archs():
    return known_archs()


def write(tmp_path, config):
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return str(path)


def error_of(tmp_path, config, archs):
    with pytest.raises(StudyConfigError) as caught:
        load_config(write(tmp_path, config), archs)
    return str(caught.value)


def test_known_archs_are_the_plugins(archs):
    assert {"bert_a_tiny", "tupe_r_base", "bert_lsin_ape_lsin_rpe_large"} <= archs
    assert "transformer" not in archs and "roberta_base" not in archs


def test_defaults_fill_a_minimal_config(tmp_path, archs):
    config = load_config(write(tmp_path, {"archs": ["tupe_r_tiny"]}), archs)
    assert config["pretrain"]["updates"] == 1000 and config["pretrain"]["tokens_per_sample"] == 128
    assert config["glue"] is None and config["squad"] is None  # run only when configured
    assert config["launcher"] == {"name": "local"} and config["corpus"] is None


def test_glue_section_takes_defaults_for_missing_keys(tmp_path, archs):
    config = load_config(write(tmp_path, {"archs": ["tupe_r_tiny"], "glue": {"tasks": ["RTE"]}}), archs)
    assert config["glue"]["seeds"] == [1, 2, 3] and config["glue"]["dir"] == os.path.abspath(GLUE_DIR)


def test_typo_in_a_top_level_key_is_named_with_a_suggestion(tmp_path, archs):
    message = error_of(tmp_path, {"archs": ["tupe_r_tiny"], "pretrian": {"updates": 5}}, archs)
    assert "key 'pretrian': unknown key; did you mean pretrain?" in message


def test_typo_in_a_nested_key_is_named_with_its_section(tmp_path, archs):
    message = error_of(tmp_path, {"archs": ["tupe_r_tiny"], "pretrain": {"update": 5}}, archs)
    assert "key 'pretrain.update': unknown key; did you mean updates" in message


def test_unknown_arch_suggests_close_names(tmp_path, archs):
    message = error_of(tmp_path, {"archs": ["bert_a_tiny", "tupe_r_tinny"]}, archs)
    assert "key 'archs[1]': unknown architecture 'tupe_r_tinny'; did you mean tupe_r_tiny" in message


def test_missing_glue_dir_is_named(tmp_path, archs):
    missing = tmp_path / "no-glue"
    message = error_of(tmp_path, {"archs": ["tupe_r_tiny"], "glue": {"dir": str(missing)}}, archs)
    assert f"key 'glue.dir': {missing}: no such folder" in message and "glue: null" in message


def test_unknown_glue_task_suggests_the_right_spelling(tmp_path, archs):
    message = error_of(tmp_path, {"archs": ["tupe_r_tiny"], "glue": {"dir": GLUE_DIR, "tasks": ["SST2"]}},
                       archs)
    assert "key 'glue.tasks[0]': unknown GLUE task 'SST2'; did you mean SST-2?" in message


def test_corpus_not_utf8_names_the_file_and_byte(tmp_path, archs):
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes("caf\u00e9 au lait\n".encode("latin-1"))
    message = error_of(tmp_path, {"archs": ["tupe_r_tiny"], "corpus": str(corpus)}, archs)
    assert f"key 'corpus': {corpus}: not UTF-8 text (byte 3" in message and "iconv" in message


def test_missing_corpus_file_is_named(tmp_path, archs):
    message = error_of(tmp_path, {"archs": ["tupe_r_tiny"], "corpus": str(tmp_path / "none.txt")}, archs)
    assert f"key 'corpus': {tmp_path / 'none.txt'}: file not found" in message


def test_missing_squad_dev_file_is_named(tmp_path, archs):
    message = error_of(tmp_path, {"archs": ["tupe_r_tiny"], "squad": {"dev": str(tmp_path / "d.json")}},
                       archs)
    assert "key 'squad.dev'" in message and "file not found" in message


def test_non_positive_updates_are_refused(tmp_path, archs):
    message = error_of(tmp_path, {"archs": ["tupe_r_tiny"], "pretrain": {"updates": 0}}, archs)
    assert "key 'pretrain.updates': must be a whole number of at least 1, got 0" in message


def test_local_launcher_refuses_executor_parameters(tmp_path, archs):
    message = error_of(tmp_path, {"archs": ["tupe_r_tiny"], "launcher": {"name": "local", "gpus": 2}},
                       archs)
    assert "key 'launcher.gpus'" in message and "name: submitit" in message


def test_bad_config_stops_the_cli_before_any_job(tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as caught:
        main([write(tmp_path, {"archs": ["tupe_r_tinny"]}), "--out", str(out)])
    assert caught.value.code == 2
    assert "did you mean tupe_r_tiny" in capsys.readouterr().err
    assert not out.exists()


def test_unknown_submitit_parameter_stops_the_cli_naming_the_launcher(tmp_path, capsys):
    config = {"archs": ["tupe_r_tiny"], "launcher": {"name": "submitit", "cluster": "local", "timeout_mn": 5}}
    with pytest.raises(SystemExit) as caught:
        main([write(tmp_path, config), "--out", str(tmp_path / "out")])
    assert caught.value.code == 2
    assert "key 'launcher': submitit refuses the executor parameters" in capsys.readouterr().err
    assert not (tmp_path / "out" / "data").exists()
