"""A one-line configuration summary in the logs of the plugin's runs, instead of a 12 KB config dump.

fairseq-train and fairseq-validate log their whole configuration as one line of about 12 KB. For a run
(or checkpoint) of one of the plugin's architectures it is replaced by a one-line summary (architecture,
task, criterion, data; for fairseq-train its --max-update, else its --total-num-update, which tupe-study
reads for its progress); the full configuration is stored in every checkpoint (``cfg``), and
``TUPE_PLUGIN_FULL_CONFIG=1`` logs it as before. Other models' runs keep fairseq's dump.

fairseq-preprocess, which builds no model, logs its options as a 1.3 KB ``Namespace(...)`` line; run with
``--user-dir tupe_plugin`` it logs the command line of the options that differ from fairseq's defaults
instead (``TUPE_PLUGIN_FULL_CONFIG=1`` logs the ``Namespace`` as before).
"""

import argparse
import logging
import os
import shlex

from omegaconf import OmegaConf

from .scope import is_plugin_config

CONFIG_LOGGERS = ("fairseq_cli.train", "fairseq_cli.validate")
PREPROCESS_LOGGER = "fairseq_cli.preprocess"
FULL_CONFIG_VARIABLE = "TUPE_PLUGIN_FULL_CONFIG"
LONG_MESSAGE = 2000


def _get(config, *path):
    for name in path:
        try:
            config = config[name] if not hasattr(config, name) else getattr(config, name)
        except (KeyError, TypeError, AttributeError):
            return None
        if config is None:
            return None
    return config


def config_summary(config, training=False):
    """One line naming what matters of a fairseq configuration; with ``training`` (fairseq-train's, not
    the saved one fairseq-validate logs), the updates it trains."""
    parts = []
    for label, path in (("arch", ("model", "_name")), ("task", ("task", "_name")),
                        ("criterion", ("criterion", "_name")), ("data", ("task", "data"))):
        value = _get(config, *path)
        if value is None and label == "arch":
            value = _get(config, "model", "arch")
        if value is not None:
            parts.append(f"{label} {value}")
    # the updates the run trains: --max-update, else the schedule's (a fine-tuning's epochs)
    for flag, path in (("--max-update", ("optimization", "max_update")),
                       ("--total-num-update", ("lr_scheduler", "total_num_update"))):
        updates = _get(config, *path)
        if training and isinstance(updates, (int, float)) and updates > 0:
            parts.append(f"{flag} {int(updates)}")
            break
    return (f"configuration: {', '.join(parts) or 'see the checkpoint'} (the full configuration is stored in "
            f"every checkpoint as cfg; {FULL_CONFIG_VARIABLE}=1 logs it here)")


class ConfigDumpFilter(logging.Filter):
    """Replace a logged configuration of a plugin architecture longer than LONG_MESSAGE by a summary."""

    def filter(self, record):
        config = record.msg
        if os.environ.get(FULL_CONFIG_VARIABLE) or record.args \
                or not (OmegaConf.is_config(config) or isinstance(config, argparse.Namespace)):
            return True
        if is_plugin_config(config) and len(str(config)) > LONG_MESSAGE:
            record.msg = config_summary(config, training=record.name == "fairseq_cli.train")
        return True


def preprocess_command(args):
    """``fairseq-preprocess`` and the options of ``args`` that differ from its parser's defaults."""
    from fairseq import options

    parser = options.get_preprocessing_parser()
    given = vars(args)
    words = ["fairseq-preprocess"]
    for action in parser._actions:
        value = given.get(action.dest, action.default)
        if not action.option_strings or value == action.default:
            continue
        flag = max(action.option_strings, key=len)
        words += [flag] if action.nargs == 0 else [flag, shlex.quote(str(value))]
    return " ".join(words)


class PreprocessArgsFilter(logging.Filter):
    """Replace fairseq-preprocess's logged ``Namespace`` of every option by :func:`preprocess_command`."""

    def filter(self, record):
        if isinstance(record.msg, argparse.Namespace) and not record.args \
                and not os.environ.get(FULL_CONFIG_VARIABLE):
            record.msg = (f"{preprocess_command(record.msg)} (every other option at fairseq's default; "
                          f"{FULL_CONFIG_VARIABLE}=1 logs them all)")
        return True


def _add_filter(name, kind):
    logger = logging.getLogger(name)
    if not any(isinstance(f, kind) for f in logger.filters):
        logger.addFilter(kind())


def install():
    for name in CONFIG_LOGGERS:
        _add_filter(name, ConfigDumpFilter)
    _add_filter(PREPROCESS_LOGGER, PreprocessArgsFilter)


install()
