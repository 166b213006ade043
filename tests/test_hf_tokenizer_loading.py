"""Loading the tokenizer of any export (native: RoBERTa, DeBERTa-v2; the remote-code model) with the docs'
line, AutoTokenizer.from_pretrained(DIR) without trust_remote_code, in a terminal (a pseudo-terminal) and
outside one: no "contains custom code ... [y/N]" prompt, no warning, no wait; decoding keeps the space
before <mask>."""
# the fixtures imported from the other test modules are the tests' arguments
# ruff: noqa: F811

import json
import os
import pty
import subprocess
import sys
import time

import pytest
from test_hf_export import make_checkpoint, whole_data_bin  # noqa: F401

from tupe_plugin.conversion.hf_export import export

CHILD = r"""
import sys, json
sys.modules["fairseq"] = None
sys.modules["tupe_plugin"] = None
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
ids = tokenizer("The history of <mask> in 1990 .")["input_ids"]
print("RESULT " + json.dumps(dict(cls=type(tokenizer).__name__, text=tokenizer.decode(ids[1:-1]),
                                  start=tokenizer.decode(tokenizer("<mask> of it")["input_ids"][1:-1]))))
"""
FAMILIES = {"roberta": ("bert_a_tiny", False), "deberta-v2": ("deberta_tiny", False),
            "remote code": ("tupe_r_tiny", False), "--remote-code": ("bert_a_tiny", True)}
# transformers 5 reads config.json through AutoConfig before tokenizer_config.json, and a config.json whose
# auto_map names the model's code (a model_type it does not know) asks to run it: not solved yet
REMOTE = pytest.mark.xfail(run=False, reason="AutoTokenizer loads the remote-code config.json first, which "
                           "prompts without trust_remote_code")


@pytest.fixture(scope="module")
def exports(whole_data_bin, tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizer_loading")
    folders = {}
    for name, (arch, remote_code) in FAMILIES.items():
        checkpoint = make_checkpoint(whole_data_bin, root / f"{arch}.pt", arch, [], heads=False)
        folders[name] = export(str(checkpoint), str(whole_data_bin), str(root / name.strip("-")),
                               remote_code=remote_code)
    return root, folders


def child_environment(root):
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_MODULES_CACHE=str(root / "modules"), HF_HUB_OFFLINE="1")
    return env


def in_a_terminal(root, folder, timeout=120):
    """(everything the child wrote to its pseudo-terminal, seconds it took)."""
    main, secondary = pty.openpty()
    start = time.monotonic()
    process = subprocess.Popen([sys.executable, "-c", CHILD, folder], stdin=secondary, stdout=secondary,
                               stderr=secondary, env=child_environment(root), cwd="/", close_fds=True)
    os.close(secondary)
    output = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
        if time.monotonic() - start > timeout:
            process.kill()
            break
    process.wait(timeout=timeout)
    os.close(main)
    text = output.decode("utf-8", "replace").replace("\r\n", "\n")
    return text, time.monotonic() - start, process.returncode


def outside_a_terminal(root, folder):
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-c", CHILD, folder], stdin=subprocess.PIPE, capture_output=True,
                            text=True, env=child_environment(root), cwd="/", timeout=120)
    return result.stdout + result.stderr, time.monotonic() - start, result.returncode


@pytest.mark.parametrize("how", [in_a_terminal, outside_a_terminal], ids=["terminal", "no terminal"])
@pytest.mark.parametrize("family", [pytest.param(name, marks=REMOTE) if "remote" in name else name
                                    for name in sorted(FAMILIES)])
def test_the_tokenizer_of_an_export_loads_without_a_prompt_or_a_warning(exports, family, how):
    root, folders = exports
    output, seconds, returncode = how(root, folders[family])
    assert returncode == 0, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("RESULT "), output
    result = json.loads(lines[0][len("RESULT "):])
    assert result["text"] == "The history of <mask> in 1990 ." and result["start"] == "<mask> of it"
    assert seconds < 60
