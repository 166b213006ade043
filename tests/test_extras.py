"""Commands that need a package of an extra (matplotlib, submitit) stop with the pip command that installs
it when the package is missing."""

import sys

import pytest

from tupe_plugin.analysis import cli as analyze_positions
from tupe_plugin.cli.extras import MissingExtraError, require
from tupe_plugin.study import cli as study
from tupe_plugin.study.launchers import SubmititLauncher


def test_missing_package_names_the_extra():
    with pytest.raises(MissingExtraError, match=r"^tupe-study needs no_such_package, which is not installed: "
                       r"pip install 'tupe-plugin\[study\]'$"):
        require("no_such_package", "study", "tupe-study")


def test_installed_package_passes():
    require("numpy", "study", "tupe-study")


@pytest.mark.parametrize("main, argv, extra", [
    (analyze_positions.main, ["--path", "unused.pt", "--out", "unused"], "analysis"),
    (study.main, ["unused.yaml", "--out", "unused"], "study"),
])
def test_commands_without_matplotlib_name_their_extra(main, argv, extra, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert f"needs matplotlib, which is not installed: pip install 'tupe-plugin[{extra}]'" in error


def test_submitit_launcher_without_submitit_names_the_study_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "submitit", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'tupe-plugin\[study\]'"):
        SubmititLauncher({"name": "submitit", "cluster": "local", "pretrain": {}}, str(tmp_path))
