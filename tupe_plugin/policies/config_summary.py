"""A one-line configuration summary in the logs of the plugin's runs, instead of a 12 KB config dump.

fairseq-train and fairseq-validate log their whole configuration as one line of about 12 KB. For a run
(or checkpoint) of one of the plugin's architectures it is replaced by a one-line summary (architecture,
task, criterion, data); the full configuration is stored in every checkpoint (``cfg``), and
``TUPE_PLUGIN_FULL_CONFIG=1`` logs it as before. Other models' runs keep fairseq's dump.
"""

import argparse
import logging
import os

from omegaconf import OmegaConf

from .scope import is_plugin_config

CONFIG_LOGGERS = ("fairseq_cli.train", "fairseq_cli.validate")
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


def config_summary(config):
    """One line naming what matters of a fairseq configuration."""
    parts = []
    for label, path in (("arch", ("model", "_name")), ("task", ("task", "_name")),
                        ("criterion", ("criterion", "_name")), ("data", ("task", "data"))):
        value = _get(config, *path)
        if value is None and label == "arch":
            value = _get(config, "model", "arch")
        if value is not None:
            parts.append(f"{label} {value}")
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
            record.msg = config_summary(config)
        return True


def install():
    for name in CONFIG_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ConfigDumpFilter) for f in logger.filters):
            logger.addFilter(ConfigDumpFilter())


install()
