"""fairseq's output stays readable with the plugin: no hydra deprecation warnings, no 12 KB config line."""

import logging
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from tupe_plugin.policies.config_summary import FULL_CONFIG_VARIABLE, ConfigDumpFilter

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
