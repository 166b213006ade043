"""The modules that lay in the package root before it held only rooms keep their import paths: each former
path is the module at its new home, the same object, in this interpreter, in a fresh one and in pickles."""

import importlib
import pickle
import subprocess
import sys

import pytest
from conftest import REPO

import tupe_plugin
from tupe_plugin.checkpoints.vocabulary import DictionaryFitError
from tupe_plugin.user_input.cli_types import finite_float

NEW_HOMES = {
    "tupe_plugin.cli_types": "tupe_plugin.user_input.cli_types",
    "tupe_plugin.command_hints": "tupe_plugin.user_input.command_hints",
    "tupe_plugin.memory_limits": "tupe_plugin.user_input.memory_limits",
    "tupe_plugin.overwritten_inputs": "tupe_plugin.user_input.overwritten_inputs",
    "tupe_plugin.path_checks": "tupe_plugin.user_input.path_checks",
    "tupe_plugin.user_errors": "tupe_plugin.user_input.user_errors",
    "tupe_plugin.child_processes": "tupe_plugin.cli.child_processes",
    "tupe_plugin.extras": "tupe_plugin.cli.extras",
    "tupe_plugin.fairseq_logs": "tupe_plugin.cli.fairseq_logs",
    "tupe_plugin.fairseq_tools": "tupe_plugin.cli.fairseq_tools",
    "tupe_plugin.prepared_folder": "tupe_plugin.cli.prepared_folder",
    "tupe_plugin.progress": "tupe_plugin.cli.progress",
    "tupe_plugin.checkpoint_config": "tupe_plugin.checkpoints.checkpoint_config",
    "tupe_plugin.vocabulary": "tupe_plugin.checkpoints.vocabulary",
    "tupe_plugin.finetuning": "tupe_plugin.downstream.finetuning",
    "tupe_plugin.run_record": "tupe_plugin.downstream.run_record",
}


@pytest.mark.parametrize("old", sorted(NEW_HOMES))
def test_a_former_path_is_the_module_at_its_new_home(old):
    new = importlib.import_module(NEW_HOMES[old])
    assert importlib.import_module(old) is new
    assert getattr(tupe_plugin, old.rpartition(".")[2]) is new


def renamed_pickle(obj, new, old):
    """``obj`` pickled as code written against the former path ``old`` (instead of ``new``) would have."""
    data = pickle.dumps(obj, protocol=0)
    assert f"c{new}\n".encode() in data
    return data.replace(f"c{new}\n".encode(), f"c{old}\n".encode())


def test_pickles_naming_a_former_path_load_the_objects_at_the_new_home():
    function = renamed_pickle(finite_float, "tupe_plugin.user_input.cli_types", "tupe_plugin.cli_types")
    assert pickle.loads(function) is finite_float
    error = renamed_pickle(DictionaryFitError("--dict d.txt"), "tupe_plugin.checkpoints.vocabulary",
                           "tupe_plugin.vocabulary")
    loaded = pickle.loads(error)
    assert type(loaded) is DictionaryFitError and loaded.args == ("--dict d.txt",)


SCRIPT = """
import pickle
import tupe_plugin.cli_types as old
from tupe_plugin.user_input import cli_types
from tupe_plugin.user_errors import UserError
from tupe_plugin.user_input.user_errors import UserError as new_user_error
assert old is cli_types and UserError is new_user_error
assert pickle.loads({pickled!r}) is cli_types.finite_float
print("ok")
"""


def test_a_former_path_imports_first_in_a_fresh_interpreter():
    pickled = renamed_pickle(finite_float, "tupe_plugin.user_input.cli_types", "tupe_plugin.cli_types")
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(pickled=pickled)], cwd=REPO, text=True,
                          capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["ok"]
