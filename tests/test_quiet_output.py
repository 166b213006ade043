"""fairseq's output stays readable with the plugin: no hydra deprecation warnings, no 12 KB config line,
no 1.3 KB ``Namespace`` line of fairseq-preprocess."""

import argparse
import logging
import os
import re
import subprocess
import sys
import warnings

import pytest
from conftest import REPO, VENV_BIN
from omegaconf import OmegaConf

from tupe_plugin.policies.config_summary import FULL_CONFIG_VARIABLE, ConfigDumpFilter, PreprocessArgsFilter

BUILD_CONFIG = """
import sys, warnings
warnings.simplefilter("default")
if sys.argv[1] == "plugin":
    import tupe_plugin
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
args = options.parse_args_and_arch(options.get_training_parser(), ["data", "--task", "masked_lm",
    "--criterion", "masked_lm", "--arch", "roberta_base", "--optimizer", "adam", "--lr", "1e-4"])
convert_namespace_to_omegaconf(args)
"""


@pytest.mark.parametrize("with_plugin", [True, False])
def test_building_fairseqs_config_prints_no_hydra_deprecation_with_the_plugin(with_plugin):
    proc = subprocess.run([sys.executable, "-c", BUILD_CONFIG, "plugin" if with_plugin else "bare"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    hydra = [line for line in proc.stderr.splitlines() if "hydra" in line.lower() and "Warning" in line]
    if with_plugin:
        assert hydra == []
    else:  # the check has teeth: fairseq alone prints them
        assert len(hydra) >= 3


@pytest.fixture(scope="module")
def warnings_of_a_module_scoped_fixture():
    """What building fairseq's configuration warns in a module-scoped fixture: it runs before any
    function-scoped fixture of the first test that needs it, under the filters pytest set for that test."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    with warnings.catch_warnings(record=True) as caught:
        convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), [
            "data", "--task", "masked_lm", "--criterion", "masked_lm", "--arch", "roberta_base"]))
    return [str(warning.message) for warning in caught]


def test_a_module_scoped_fixture_sees_fairseqs_known_warnings_filtered(warnings_of_a_module_scoped_fixture):
    assert warnings_of_a_module_scoped_fixture == []


def config_record(config):
    return logging.LogRecord("fairseq_cli.train", logging.INFO, "train.py", 74, config, None, None)


def big_config():
    return OmegaConf.create({"common": {f"option_{i}": "x" * 40 for i in range(100)},
                             "model": {"_name": "tupe_r_tiny"},
                             "task": {"_name": "masked_lm", "data": "data-bin"},
                             "criterion": {"_name": "masked_lm"}})


def test_a_logged_configuration_becomes_a_one_line_summary(monkeypatch):
    monkeypatch.delenv(FULL_CONFIG_VARIABLE, raising=False)
    record = config_record(big_config())
    assert ConfigDumpFilter().filter(record)
    assert record.getMessage().startswith("configuration: arch tupe_r_tiny, task masked_lm, criterion "
                                          "masked_lm, data data-bin (")
    assert len(record.getMessage()) < 300


@pytest.mark.parametrize("schedule, said", [({"optimization": {"max_update": 400}}, "--max-update 400"),
                                            ({"optimization": {"max_update": 0},
                                              "lr_scheduler": {"total_num_update": 20.0}},
                                             "--total-num-update 20")])
def test_training_summary_names_the_updates_it_trains(monkeypatch, schedule, said):
    monkeypatch.delenv(FULL_CONFIG_VARIABLE, raising=False)
    record = config_record(OmegaConf.merge(big_config(), schedule))
    ConfigDumpFilter().filter(record)
    assert record.getMessage().startswith(f"configuration: arch tupe_r_tiny, task masked_lm, criterion "
                                          f"masked_lm, data data-bin, {said} (")


def test_validation_summary_names_no_updates_of_the_saved_training(monkeypatch):
    monkeypatch.delenv(FULL_CONFIG_VARIABLE, raising=False)
    saved = OmegaConf.merge(big_config(), {"optimization": {"max_update": 400}})
    record = logging.LogRecord("fairseq_cli.validate", logging.INFO, "validate.py", 79, saved, None, None)
    ConfigDumpFilter().filter(record)
    assert "update" not in record.getMessage()


def test_full_configuration_is_logged_when_asked(monkeypatch):
    monkeypatch.setenv(FULL_CONFIG_VARIABLE, "1")
    record = config_record(big_config())
    ConfigDumpFilter().filter(record)
    assert len(record.getMessage()) > 2000


@pytest.mark.parametrize("message", ["task: MaskedLMTask", OmegaConf.create({"short": 1})])
def test_ordinary_and_short_messages_pass_unchanged(message):
    record = config_record(message)
    ConfigDumpFilter().filter(record)
    assert record.msg is message


def test_the_filter_is_on_fairseqs_train_and_validate_loggers():
    for name in ("fairseq_cli.train", "fairseq_cli.validate"):
        assert any(isinstance(f, ConfigDumpFilter) for f in logging.getLogger(name).filters)


def test_the_readmes_fairseq_preprocess_commands_load_the_plugin():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        commands = re.findall(r"^fairseq-preprocess .*$", f.read(), flags=re.M)
    assert commands and all(command.startswith("fairseq-preprocess --user-dir tupe_plugin ")
                            for command in commands)


def test_fairseq_preprocess_with_the_plugin_logs_its_options_as_a_short_command_line(tmp_path):
    (tmp_path / "tupe_plugin").symlink_to(os.path.join(REPO, "tupe_plugin"))
    (tmp_path / "spm").mkdir()
    for split in ("train", "valid"):
        (tmp_path / "spm" / f"{split}.bpe").write_text("▁a ▁b c\n▁b c ▁d\n", encoding="utf-8")
    (tmp_path / "spm" / "dict.txt").write_text("▁a 1\n▁b 1\nc 1\n▁d 1\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != FULL_CONFIG_VARIABLE}
    proc = subprocess.run(
        [os.path.join(VENV_BIN, "fairseq-preprocess"), "--user-dir", "tupe_plugin", "--only-source",
         "--trainpref", "spm/train.bpe", "--validpref", "spm/valid.bpe", "--srcdict", "spm/dict.txt",
         "--destdir", "data-bin"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    options = ("fairseq-preprocess --user-dir tupe_plugin --trainpref spm/train.bpe "
               "--validpref spm/valid.bpe --srcdict spm/dict.txt --only-source "
               f"(every other option at fairseq's default; {FULL_CONFIG_VARIABLE}=1 logs them all)")
    assert f"fairseq_cli.preprocess:{options}\n" in proc.stdout
    assert "Namespace(" not in proc.stdout  # --destdir data-bin is fairseq's default: not named
    assert (tmp_path / "data-bin" / "preprocess.log").read_text(encoding="utf-8").splitlines()[0] == options


def preprocess_record(args):
    return logging.LogRecord("fairseq_cli.preprocess", logging.INFO, "preprocess.py", 288, args, None, None)


def test_fairseq_preprocess_logs_every_option_when_asked(monkeypatch):
    monkeypatch.setenv(FULL_CONFIG_VARIABLE, "1")
    args = argparse.Namespace(destdir="data-bin", workers=4)
    record = preprocess_record(args)
    assert PreprocessArgsFilter().filter(record)
    assert record.msg is args
