"""scripts/study.py's config checks: a bad config stops before any job, naming the key and the fix."""

import os
import shutil

import pytest
import yaml

from tupe_plugin.study.cli import known_archs, main
from tupe_plugin.study.config import StudyConfigError, load_config
from tupe_plugin.study.yaml_file import read_mapping

from conftest import REPO, test_data

GLUE_DIR = test_data("glue")


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


def test_missing_archs_are_named_as_required(tmp_path, archs):
    message = error_of(tmp_path, {"pretrain": {"updates": 5}}, archs)
    assert "key 'archs': is required: the --arch names to compare" in message


def test_glue_section_takes_defaults_for_missing_keys(tmp_path, archs):
    glue = {"dir": GLUE_DIR, "tasks": ["RTE"]}
    config = load_config(write(tmp_path, {"archs": ["tupe_r_tiny"], "glue": glue}), archs)
    assert config["glue"]["seeds"] == [1, 2, 3] and config["glue"]["dir"] == os.path.abspath(GLUE_DIR)
    assert config["glue"]["max_epoch"] is None and config["glue"]["lrs"] == [2e-5]  # the tasks' epochs


def test_glue_section_without_dir_says_where_to_get_glue(tmp_path, archs):
    message = error_of(tmp_path, {"archs": ["tupe_r_tiny"], "glue": {"tasks": ["RTE"]}}, archs)
    assert "key 'glue.dir': is required: the folder of the GLUE data" in message
    assert "download_glue_data.py" in message and "gluebenchmark.com" in message and "glue: null" in message


def test_squad_section_without_dev_says_where_to_get_squad(tmp_path, archs):
    message = error_of(tmp_path, {"archs": ["tupe_r_tiny"], "squad": {"max_articles": 4}}, archs)
    assert "key 'squad.dev': is required: the SQuAD dev file" in message
    assert "rajpurkar.github.io/SQuAD-explorer" in message and "squad: null" in message


def partial_glue(tmp_path, files):
    """A GLUE folder with RTE's ``files`` only (copied from the test data)."""
    (tmp_path / "glue" / "RTE").mkdir(parents=True)
    for name in files:
        shutil.copy(test_data("glue", "RTE", name), tmp_path / "glue" / "RTE" / name)
    return str(tmp_path / "glue")


def test_glue_task_missing_from_glue_dir_is_named_with_its_folder(tmp_path, archs):
    glue = partial_glue(tmp_path, ["train.tsv", "dev.tsv"])
    message = error_of(tmp_path, {"archs": ["tupe_r_tiny"], "glue": {"dir": glue, "tasks": ["RTE", "MRPC"]}},
                       archs)
    mrpc = os.path.join(glue, "MRPC")
    assert f"key 'glue.tasks[1]': {mrpc}: no such folder: glue.dir has no GLUE task MRPC" in message
    assert "gluebenchmark.com" in message


@pytest.mark.parametrize("present, missing", [(["train.tsv"], "dev.tsv"), (["dev.tsv"], "train.tsv")])
def test_glue_task_without_its_train_or_dev_file_is_named_with_the_file(tmp_path, archs, present, missing):
    glue = partial_glue(tmp_path, present)
    message = error_of(tmp_path, {"archs": ["tupe_r_tiny"], "glue": {"dir": glue, "tasks": ["RTE"]}}, archs)
    assert (f"key 'glue.tasks[0]': {os.path.join(glue, 'RTE', missing)}: no such file: the GLUE task RTE "
            f"needs its {missing}") in message


def test_mnli_mismatched_is_checked_in_the_mnli_folder(tmp_path, archs):
    folder = tmp_path / "glue" / "MNLI"
    folder.mkdir(parents=True)
    for name in ("train.tsv", "dev_matched.tsv"):
        (folder / name).write_text("index\tsentence1\tsentence2\tgold_label\n")
    mnli = {"archs": ["tupe_r_tiny"], "glue": {"dir": str(tmp_path / "glue"), "tasks": ["MNLI"]}}
    assert load_config(write(tmp_path, mnli), archs)["glue"]["tasks"] == ["MNLI"]
    mnli["glue"]["tasks"] = ["MNLI-mm"]
    assert f"{folder / 'dev_mismatched.tsv'}: no such file" in error_of(tmp_path, mnli, archs)


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
    assert "gluebenchmark.com" in message


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
    assert f"key 'corpus': {tmp_path / 'none.txt'}: no such file" in message


def test_missing_squad_dev_file_is_named(tmp_path, archs):
    message = error_of(tmp_path, {"archs": ["tupe_r_tiny"], "squad": {"dev": str(tmp_path / "d.json")}},
                       archs)
    assert "key 'squad.dev'" in message and "no such file" in message
    assert "rajpurkar.github.io/SQuAD-explorer" in message


def error_of_text(tmp_path, text, archs):
    """The error of a config file written as ``text`` (YAML that yaml.safe_dump would not write)."""
    path = tmp_path / "study.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(StudyConfigError) as caught:
        load_config(str(path), archs)
    return str(caught.value)


# Each line nine aliases of the line before: 10 values (a list of 9), then 91, 820, 7381, 66430 (line 6).
NINEFOLD_ALIASES = "archs: [tupe_r_tiny]\na: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{name}: &{name} [{', '.join(['*' + previous] * 9)}]\n" for previous, name in zip("abcd", "bcde"))


@pytest.mark.parametrize("text, problem", [
    ("archs: [tupe_r_tiny]\narchs: [bert_a_tiny]\n",
     "line 2: the key 'archs' is given twice in its section (first on line 1): keep one"),
    ("archs: [tupe_r_tiny]\npretrain: {updates: 5\n",
     "line 2: the '{' at column 11 is not closed"),
    ("archs: [tupe_r_tiny]\npretrain:\n\tupdates: 5\n",
     "line 3: a tab at column 1; YAML indents with spaces: replace the tab with spaces"),
    (NINEFOLD_ALIASES,
     "line 6: its aliases (*name) expand to more than 10000 values, more than a study config holds: "
     "write the values out"),
    ("archs: [tupe_r_tiny]\nx: &x [1, *x]\n",
     "line 2: an alias (*name) inside the section it names: write the values out"),
    ("archs: [tupe_r_tiny]\npretrain: !!python/object/apply:os.system [echo]\n",
     "line 2: the tag '!!python/object/apply:os.system' is not plain data (a study config holds text, "
     "numbers, lists and mappings): remove it"),
], ids=["duplicate-key", "unclosed-brace", "tab-indent", "aliases-expanding", "alias-in-itself",
        "python-tag"])
def test_a_yaml_error_is_one_line_naming_the_file_and_line(tmp_path, archs, text, problem):
    message = error_of_text(tmp_path, text, archs)
    assert message.startswith(f"{tmp_path / 'study.yaml'}: {problem}") and "\n" not in message


def test_aliases_and_merge_keys_within_a_configs_size_are_read_as_their_values(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text("steps: &steps {updates: 5}\nglue: {tasks: &tasks [RTE, MRPC]}\npretrain:\n  <<: *steps\n"
                    "squad: {tasks: *tasks}\n", encoding="utf-8")
    assert read_mapping(str(path), "archs: [...]") == {
        "steps": {"updates": 5}, "glue": {"tasks": ["RTE", "MRPC"]}, "pretrain": {"updates": 5},
        "squad": {"tasks": ["RTE", "MRPC"]}}


def test_a_plain_string_as_the_config_is_named_as_such_not_as_an_unknown_key(tmp_path, archs):
    message = error_of_text(tmp_path, "tupe_r_tiny bert_a_tiny\n", archs)
    assert message.startswith(f"{tmp_path / 'study.yaml'}: line 1: the file holds the text "
                              "'tupe_r_tiny bert_a_tiny', not a mapping of keys: write KEY: VALUE lines")
    assert "unknown key" not in message


def test_decreasing_stage_lengths_are_refused_naming_the_stage(tmp_path, archs):
    stages = [{"tokens_per_sample": 64, "updates": 4}, {"tokens_per_sample": 32, "updates": 2}]
    message = error_of(tmp_path, {"archs": ["tupe_r_tiny"], "pretrain": {"stages": stages}}, archs)
    assert ("key 'pretrain.stages[1].tokens_per_sample': 32 is shorter than pretrain.stages[0]'s 64: "
            "the model's positions are sized for the last stage's length") in message


def test_evaluate_at_may_list_the_last_update_which_is_evaluated_anyway(tmp_path, archs):
    pretrain = {"updates": 60, "validate_every": 30, "evaluate_at": [30, 60]}
    config = load_config(write(tmp_path, {"archs": ["tupe_r_tiny"], "pretrain": pretrain}), archs)
    assert config["pretrain"]["evaluate_at"] == [30]


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


def test_glue_task_without_its_dev_file_stops_the_cli_before_any_job(tmp_path, capsys):
    glue = partial_glue(tmp_path, ["train.tsv"])
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as caught:
        main([write(tmp_path, {"archs": ["tupe_r_tiny"], "glue": {"dir": glue, "tasks": ["RTE"]}}),
              "--out", str(out)])
    assert caught.value.code == 2
    assert f"{os.path.join(glue, 'RTE', 'dev.tsv')}: no such file" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("example", ["study-tiny.yaml", "study-glue.yaml"])
def test_example_configs_read_data_only_inside_the_working_folder(example, archs, tmp_path, monkeypatch):
    shutil.copytree(test_data("glue"), tmp_path / "glue_data")  # where examples/study-glue.yaml looks
    monkeypatch.chdir(tmp_path)
    config = load_config(os.path.join(REPO, "examples", example), archs)
    assert config["squad"] is None and config["corpus"] is None
    if example == "study-tiny.yaml":  # `make study`: nothing to download
        assert config["glue"] is None
    else:
        assert config["glue"]["dir"] == str(tmp_path / "glue_data")


def test_unknown_submitit_parameter_stops_the_cli_naming_the_launcher(tmp_path, capsys):
    config = {"archs": ["tupe_r_tiny"], "launcher": {"name": "submitit", "cluster": "local", "timeout_mn": 5}}
    with pytest.raises(SystemExit) as caught:
        main([write(tmp_path, config), "--out", str(tmp_path / "out")])
    assert caught.value.code == 2
    assert "key 'launcher': submitit refuses the executor parameters" in capsys.readouterr().err
    assert not (tmp_path / "out" / "data").exists()


PAPER_CONFIGS = ["tupe-table2", "wang-table2", "modern"]
OTHER_CONFIGS = ["study-tiny-seeds"]


@pytest.mark.parametrize("name", [n + size for n in PAPER_CONFIGS for size in ("", "-tiny")] + OTHER_CONFIGS)
def test_paper_protocol_configs_pass_the_config_check(name, archs, tmp_path, monkeypatch):
    """Each config with the files it names laid out as their official sources lay them out."""
    from tupe_plugin.glue.tasks import GLUE_TASKS

    for task in GLUE_TASKS.values():
        for path in task.files(str(tmp_path / "glue_data")).values():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            shutil.copy(test_data("glue", "RTE", "dev.tsv"), path)
    (tmp_path / "squad").mkdir()
    for version in ("1.1", "2.0"):
        for split in ("train", "dev"):
            shutil.copy(test_data("squad", "dev-v1.1.head.json"),
                        tmp_path / "squad" / f"{split}-v{version}.json")
    (tmp_path / "wiki-books.txt").write_text("a paragraph\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    config = load_config(os.path.join(REPO, "examples", f"{name}.yaml"), archs)
    assert config["archs"] and config["pretrain"]["updates"] > 0


@pytest.mark.parametrize("text, key, value", [
    ("report: {plateau_bits: .nan}", "report.plateau_bits", "nan"),
    ("report: {min_margin_bits: .inf}", "report.min_margin_bits", "inf"),
    ("pretrain: {lr: -.inf}", "pretrain.lr", "-inf"),
    ("glue: {dir: glue, lrs: [1.0e-5, .nan]}", "glue.lrs[1]", "nan"),
    ("extrapolation: {rotary_scalings: [{scaling: linear, factor: .inf}]}",
     "extrapolation.rotary_scalings[0].factor", "inf"),
], ids=["plateau-nan", "margin-inf", "lr-minus-inf", "glue-lr-nan", "scaling-factor-inf"])
def test_a_number_that_is_not_finite_is_refused_naming_its_key(tmp_path, archs, text, key, value):
    """NaN compares false with every bound: .nan passed the checks of 0, negatives and strings."""
    message = error_of_text(tmp_path, f"archs: [tupe_r_tiny]\n{text}\n", archs)
    assert message == (f"{tmp_path / 'study.yaml'}: key '{key}': must be a finite number, got {value}: "
                       "write a number (YAML's .nan and .inf are none)")
