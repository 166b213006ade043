"""The ``tupe-*`` commands of the installed distribution: the list, and each one's main(["--help"])."""

from importlib.metadata import entry_points

import pytest

COMMANDS = {
    "tupe-study", "tupe-analyze", "tupe-prepare-glue", "tupe-prepare-squad", "tupe-evaluate-squad",
    "tupe-convert-official", "tupe-convert-hf", "tupe-export-hf", "tupe-collect-glue", "tupe-build-corpus",
    "tupe-train-spm",
    "tupe-export-embeddings", "tupe-show-progress", "tupe-finetune-glue", "tupe-finetune-squad",
    "tupe-encodings",
}


def installed_commands():
    """{name: entry point} of the console scripts the tupe-plugin distribution installs."""
    return {entry.name: entry for entry in entry_points(group="console_scripts")
            if entry.dist is not None and entry.dist.name == "tupe-plugin"}


def test_the_distribution_installs_every_command():
    assert set(installed_commands()) == COMMANDS


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_imports_and_answers_help(name, capsys):
    main = installed_commands()[name].load()
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: ")
