"""The scripts refuse an unusable device, an --out that is a file and non-UTF-8 files in one line, and name
their own flags."""

import argparse
import json

import pytest
import torch
from conftest import build_model, make_dictionary
from fairseq import options

from tupe_plugin.analysis import cli as analyze_positions
from tupe_plugin.analysis import export_embeddings
from tupe_plugin.corpus import build as build_corpus
from tupe_plugin.encodings.position_config import PositionConfig
from tupe_plugin.glue import finetune as finetune_glue
from tupe_plugin.glue import prepare as prepare_glue
from tupe_plugin.glue.tasks import GLUE_TASKS
from tupe_plugin.models import checkpoint_init, embedding_init, model_flags
from tupe_plugin.squad import evaluate as evaluate_squad
from tupe_plugin.squad import finetune as finetune_squad
from tupe_plugin.squad import prepare as prepare_squad
from tupe_plugin.study import extrapolation
from tupe_plugin.user_input.cli_types import finite_float


def refused(main, argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in argv])
    assert exit_info.value.code not in (0, None)
    return capsys.readouterr().err + (exit_info.value.code if isinstance(exit_info.value.code, str) else "")


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_analysis_on_a_cuda_device_without_cuda_is_refused(device, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = refused(analyze_positions.main, ["--path", "unused.pt", "--out", tmp_path, "--device", device],
                  capsys)
    assert f"--device {device}: torch finds no CUDA device on this machine; use --device cpu" in err


def test_analysis_on_a_device_torch_does_not_know_is_refused(tmp_path, capsys):
    err = refused(analyze_positions.main, ["--path", "unused.pt", "--out", tmp_path, "--device", "gpu0"],
                  capsys)
    assert "--device gpu0:" in err


@pytest.mark.parametrize("name", ["analysis", "report.json"])
def test_analysis_out_that_is_a_file_is_refused(name, tmp_path, capsys):
    (tmp_path / name).write_text("a file")
    err = refused(analyze_positions.main,
                  ["--path", "unused.pt", "--out", tmp_path / name, "--device", "cpu"], capsys)
    assert f"--out {tmp_path / name} is a file; give a folder" in err


@pytest.mark.parametrize("line, text", [(3, "caf\xe9 au lait"), (1, "s\xe9ntence")])
def test_a_glue_file_that_is_not_utf8_is_refused_naming_the_line(line, text, tmp_path):
    lines = ["sentence\tlabel", "a fine film\t1", "a dull film\t0", "more\t1"]
    lines[line - 1] = lines[line - 1].replace(lines[line - 1].split("\t")[0], text)
    path = tmp_path / "SST-2" / "train.tsv"
    path.parent.mkdir()
    path.write_bytes(("\n".join(lines) + "\n").encode("latin-1"))
    with pytest.raises(prepare_glue.GlueFormatError, match=f"{path}:{line}: not UTF-8 text \\(byte 0xe9"):
        prepare_glue.read_tsv(str(path), GLUE_TASKS["SST-2"])


@pytest.mark.parametrize("line", [1, 4])
def test_a_squad_file_that_is_not_utf8_is_refused_naming_the_line(line, tmp_path):
    lines = json.dumps({"data": [{"title": "t", "paragraphs": []}]}, indent=1).split("\n")
    lines[line - 1] += " \xe9"  # a latin-1 byte on that line (line 4 holds the title)
    path = tmp_path / "squad.json"
    path.write_bytes("\n".join(lines).encode("latin-1"))
    with pytest.raises(prepare_squad.SquadFormatError, match=f"{path}:{line}: not UTF-8 text \\(byte 0xe9"):
        prepare_squad.read_squad(str(path))


def test_export_names_its_own_dict_flag_when_no_dictionary_is_found(tmp_path, capsys):
    model = build_model("tupe_r_tiny", make_dictionary())
    torch.save({"model": model.state_dict()}, tmp_path / "model.pt")
    err = refused(export_embeddings.main, [tmp_path / "model.pt", "--out", tmp_path / "v.txt"], capsys)
    assert "pass --dict DICT" in err and "--embed-init" not in err


def test_export_names_the_checkpoint_not_embed_init_path(tmp_path, capsys):
    torch.save({"model": {"w": torch.zeros(2)}}, tmp_path / "model.pt")
    err = refused(export_embeddings.main, [tmp_path / "model.pt", "--out", tmp_path / "v.txt"], capsys)
    assert (f"{tmp_path / 'model.pt'}: the checkpoint has no token embedding" in err
            and "--embed-init" not in err)


@pytest.mark.parametrize("command, argv", [
    ("finetune_glue", ["RTE", "ckpt.pt", "data-bin", "--max-examples"]),
    ("finetune_squad", ["1.1", "ckpt.pt", "data-bin", "--max-articles"]),
    ("evaluate_squad", ["--gold-file", "dev.json", "--predictions", "p.json", "--max-articles"]),
])
@pytest.mark.parametrize("count", ["0", "-2"])
def test_a_count_below_one_is_refused_rather_than_read_as_all(command, argv, count, capsys):
    """0 was falsy: tupe-finetune-glue and tupe-finetune-squad kept every example, tupe-evaluate-squad
    none."""
    main = {"finetune_glue": finetune_glue, "finetune_squad": finetune_squad,
            "evaluate_squad": evaluate_squad}[command].main
    err = refused(main, argv + [count], capsys)
    assert f"{argv[-1]}: must be at least 1, got {count}" in err


def plugin_model_float_flags():
    """Every float flag the plugin adds to fairseq's model flags."""
    parser = argparse.ArgumentParser()
    for add_args in (PositionConfig.add_args, model_flags.add_args, embedding_init.add_args,
                     checkpoint_init.add_args):
        add_args(parser)
    return [action.option_strings[0] for action in parser._actions if action.type in (float, finite_float)]


@pytest.mark.parametrize("flag", plugin_model_float_flags())
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_model_float_flag_that_is_not_finite_is_refused_as_it_is_parsed(flag, value, capsys):
    """nan passed the range checks (nan < 1 is false) and training stopped at nan gradients."""
    argv = ["data", "--task", "masked_lm", "--arch", "tupe_r_tiny", flag, value]
    with pytest.raises(SystemExit):
        options.parse_args_and_arch(options.get_training_parser(), argv)
    assert f"argument {flag}: must be a finite number, got {value}" in capsys.readouterr().err


@pytest.mark.parametrize("main, argv, flag", [
    (evaluate_squad.main, ["--gold-file", "dev.json", "--predictions", "p.json"], "--null-threshold"),
    (finetune_squad.main, ["2.0", "ckpt.pt", "data-bin"], "--null-threshold"),
    (export_embeddings.main, ["model.pt", "--out", "v.txt"], "--scale"),
    (build_corpus.main, ["--output-dir", "corpus"], "--valid-fraction"),
    (build_corpus.main, ["--output-dir", "corpus"], "--test-fraction"),
    (extrapolation.main, ["--path", "c.pt", "--data", "d", "--length", "64", "--out", "o.json",
                          "--rotary-scaling", "linear"], "--rotary-scaling-factor"),
])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_tool_float_flag_that_is_not_finite_is_refused_as_it_is_parsed(main, argv, flag, value, capsys):
    err = refused(main, argv + [flag, value], capsys)
    assert f"argument {flag}: must be a finite number, got {value}" in err


@pytest.mark.parametrize("main, argv", [(finetune_glue.main, ["RTE", "ckpt.pt", "data-bin"]),
                                        (finetune_squad.main, ["2.0", "ckpt.pt", "data-bin"])])
@pytest.mark.parametrize("value, problem", [("nan", "must be a finite number, got nan"),
                                            ("inf", "must be a finite number, got inf"),
                                            ("0", "must be above 0, got 0"), ("-1e-5", "must be above 0")])
def test_a_fine_tuning_learning_rate_that_is_no_positive_number_is_refused(main, argv, value, problem,
                                                                           capsys):
    assert f"argument --lr: {problem}" in refused(main, argv + [f"--lr={value}"], capsys)


@pytest.mark.parametrize("output", ["checkpoint", "dict-beside-it", "dict-by-another-path", "given-dict"])
def test_export_to_an_input_is_refused_and_the_input_left_as_it_was(output, tmp_path, capsys):
    checkpoint, given = tmp_path / "run" / "model.pt", tmp_path / "data" / "dict.txt"
    checkpoint.parent.mkdir()
    given.parent.mkdir()
    torch.save({"model": build_model("tupe_r_tiny", make_dictionary()).state_dict()}, checkpoint)
    make_dictionary().save(str(checkpoint.parent / "dict.txt"))
    make_dictionary().save(str(given))
    target = {"checkpoint": checkpoint, "dict-beside-it": checkpoint.parent / "dict.txt",
              "dict-by-another-path": tmp_path / "data" / ".." / "run" / "dict.txt",
              "given-dict": given}[output]
    argv = [checkpoint, "--out", target] + (["--dict", given] if output == "given-dict" else [])
    before = target.read_bytes()
    err = refused(export_embeddings.main, argv, capsys)
    assert f"--out {target} is the " in err and "which the vectors would overwrite" in err
    assert target.read_bytes() == before


def test_a_corpus_that_the_built_split_would_overwrite_is_refused_and_left_as_it_was(tmp_path, capsys):
    corpus = tmp_path / "corpus" / "train.txt"
    corpus.parent.mkdir()
    corpus.write_text("One document.\n\nAnother one.\n", encoding="utf-8")
    err = refused(build_corpus.main, ["--output-dir", tmp_path / "corpus" / ".", "--corpus", corpus], capsys)
    assert "its train.txt is the --corpus file, which the train split would overwrite" in err
    assert corpus.read_text(encoding="utf-8") == "One document.\n\nAnother one.\n"
