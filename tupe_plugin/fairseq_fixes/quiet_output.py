"""Keep fairseq's command-line output readable: no hydra deprecation warnings, no one-line config dumps.

fairseq 0.12 builds its configuration through hydra APIs that hydra has since deprecated, so every
fairseq command prints about fifty lines of deprecation warnings; these are silenced by message (other
warnings stay). fairseq-train and fairseq-validate log their whole configuration as one line of about
12 KB; it is replaced by a one-line summary (architecture, task, criterion, data). The full configuration
is stored in every checkpoint (``cfg``); ``TUPE_PLUGIN_FULL_CONFIG=1`` logs it as before.
"""

import logging
import os
import warnings

HYDRA_DEPRECATIONS = (
    r"hydra\.experimental\.(initialize|compose)\(\) is no longer experimental",
    r"\s*The version_base parameter is not specified",
    r"In '[^']*': Usage of deprecated keyword in package header",
    r"\s*'[^']*' is validated against ConfigStore schema with the same name",
    r"\s*The strict flag in the compose API is deprecated",
)
CONFIG_LOGGERS = ("fairseq_cli.train", "fairseq_cli.validate")
FULL_CONFIG_VARIABLE = "TUPE_PLUGIN_FULL_CONFIG"
LONG_MESSAGE = 2000


def silence_hydra_deprecations():
    for message in HYDRA_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message)


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
    """Replace a logged configuration object (not a text message) longer than LONG_MESSAGE by a summary."""

    def filter(self, record):
        if os.environ.get(FULL_CONFIG_VARIABLE) or isinstance(record.msg, str) or record.args:
            return True
        if len(str(record.msg)) > LONG_MESSAGE:
            record.msg = config_summary(record.msg)
        return True


def install():
    silence_hydra_deprecations()
    for name in CONFIG_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ConfigDumpFilter) for f in logger.filters):
            logger.addFilter(ConfigDumpFilter())


install()
