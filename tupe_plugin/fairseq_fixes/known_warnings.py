"""The one list of fairseq's and torch's known-harmless warnings, silenced by message, each with its reason.

Every warning not listed here stays. The plugin's own code raises none of these: its warnings are fixed
where they arise. Besides the list, fairseq's ``fairseq/models/wav2vec/wav2vec2_classification.py`` calls
``logging.basicConfig(level=logging.DEBUG)`` when fairseq's models are imported, so every command that
imports them before configuring its logging (fairseq-validate) printed hydra's ``DEBUG:hydra.core.utils``
lines; the root logger is put back to fairseq's level (``LOGLEVEL``, default INFO).
"""

import logging
import os
import warnings

# (category, message pattern, why it is harmless)
KNOWN_WARNINGS = (
    (UserWarning, r"hydra\.experimental\.(initialize|compose)\(\) is no longer experimental",
     "fairseq 0.12 builds its configuration through hydra APIs hydra has since renamed; about fifty lines "
     "per command that no user can act on"),
    (UserWarning, r"\s*The version_base parameter is not specified", "the same hydra configuration code"),
    (UserWarning, r"In '[^']*': Usage of deprecated keyword in package header", "fairseq's hydra configs"),
    (UserWarning, r"\s*'[^']*' is validated against ConfigStore schema with the same name",
     "fairseq's hydra configs"),
    (UserWarning, r"\s*The strict flag in the compose API is deprecated", "fairseq's hydra configs"),
    (UserWarning, r"'pin_memory' argument is set as true but no accelerator is found",
     "fairseq's data iterators always ask for pinned memory; on a CPU torch just does not pin"),
    (FutureWarning, r"`torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated",
     "fairseq's train_step enters torch.cuda.amp.autocast(enabled=False) unless --amp: a no-op"),
    (FutureWarning, r"`torch\.cuda\.amp\.GradScaler\(args\.\.\.\)` is deprecated",
     "fairseq's --amp optimizer builds the old name of torch.amp.GradScaler('cuda'), the same class"),
    (FutureWarning, r"Using (a )?non-full backward hook",
     "fairseq's NanDetector (after a NaN loss, or --detect-anomaly) hooks every module with the old "
     "register_backward_hook; it only reads the gradients it is given to name the first non-finite one"),
)



def install():
    """Add the filters (again: ``warnings.catch_warnings``, as pytest enters for every test, drops them)."""
    for category, message, _reason in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


install()
if logging.getLogger().level == logging.DEBUG and os.environ.get("LOGLEVEL", "INFO").upper() != "DEBUG":
    logging.getLogger().setLevel(os.environ.get("LOGLEVEL", "INFO").upper())
