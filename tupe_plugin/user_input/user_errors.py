"""The plugin's errors about a user's input, said in one line.

A mistake the plugin recognises (a flag that cannot be built, a damaged checkpoint, a dictionary that
does not fit, ...) raises an exception whose class derives from :class:`UserError`, with a message that
names the flag or file and the fix. Left uncaught in a command (fairseq-train, fairseq-validate, the
scripts), it is printed as one ``error:`` line instead of a traceback through fairseq, and the command
exits with status 1; ``TUPE_PLUGIN_TRACEBACK=1`` keeps the full traceback (documented in
docs/troubleshooting.md, not repeated under every error: the line is the message and nothing else, so a
log's last line is the fix, and scripts that read the error get it whole). fairseq sometimes wraps the
error (e.g. "Cannot load model parameters from checkpoint"): the plugin's error in the chain is the one
printed. In a fairseq run of another model (``--arch roberta_base --user-dir tupe_plugin``) every error
keeps its traceback, as without the plugin.
"""

import os
import sys

TRACEBACK_VARIABLE = "TUPE_PLUGIN_TRACEBACK"


class UserError(Exception):
    """Base of the plugin's errors about the user's input; the message says what to change."""


def user_error_in(error):
    """The first :class:`UserError` in ``error``'s chain of causes and contexts, or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, UserError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def install(keeps_tracebacks):
    """Print uncaught user errors in one line (once per interpreter), except while ``keeps_tracebacks()``
    says every error keeps its traceback (the plugin passes "in a fairseq run of another model")."""
    previous = sys.excepthook
    if getattr(previous, "prints_user_errors", False):
        return

    def excepthook(kind, error, traceback):
        found = user_error_in(error)
        if found is None or os.environ.get(TRACEBACK_VARIABLE) or keeps_tracebacks():
            previous(kind, error, traceback)
            return
        print(f"error: {found}", file=sys.stderr)

    excepthook.prints_user_errors = True
    sys.excepthook = excepthook
