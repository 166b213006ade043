"""The import paths of the modules that lay in the package root before it held only rooms
(``tupe_plugin.user_errors``, ``tupe_plugin.cli_types``, ``tupe_plugin.finetuning``, ...), for code and
pickles that name them: the plugin's import registers each as the module at its new home, the same object.
New code imports the new homes.
"""

import importlib
import sys

PACKAGE = __name__.rpartition(".")[0]

NEW_HOMES = {
    **{name: f"user_input.{name}" for name in (
        "cli_types", "command_hints", "memory_limits", "overwritten_inputs", "path_checks", "user_errors")},
    **{name: f"cli.{name}" for name in (
        "child_processes", "extras", "fairseq_logs", "fairseq_tools", "prepared_folder", "progress")},
    **{name: f"checkpoints.{name}" for name in ("checkpoint_config", "vocabulary")},
    **{name: f"downstream.{name}" for name in ("finetuning", "run_record")},
}

for _old, _new in NEW_HOMES.items():
    _module = importlib.import_module(f"{PACKAGE}.{_new}")
    sys.modules[f"{PACKAGE}.{_old}"] = _module
    setattr(sys.modules[PACKAGE], _old, _module)
