"""Loading the tokenizer of any export (native: RoBERTa, DeBERTa-v2; the remote-code model) with the line
of its model card (AutoTokenizer.from_pretrained(FOLDER) for a native export, PreTrainedTokenizerFast for the
remote-code model's tokenizer.json), in a terminal (a pseudo-terminal) and outside one: no "contains custom
code ... [y/N]" prompt, no warning, no wait; decoding keeps the space before <mask>."""
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
import os, sys, json
sys.modules["fairseq"] = None
sys.modules["tupe_plugin"] = None
FOLDER = sys.argv[1]
with open(os.path.join(FOLDER, "README.md"), encoding="utf-8") as card:
    snippet = card.read().split("```python")[1].split("```")[0]
exec("\n".join(line for line in snippet.splitlines() if "import" in line or line.startswith("tokenizer =")))
ids = tokenizer("The history of <mask> in 1990 .")["input_ids"]
print("RESULT " + json.dumps(dict(cls=type(tokenizer).__name__, text=tokenizer.decode(ids[1:-1]),
                                  start=tokenizer.decode(tokenizer("<mask> of it")["input_ids"][1:-1]))))
"""
FAMILIES = {"roberta": ("bert_a_tiny", False), "deberta-v2": ("deberta_tiny", False),
            "remote code": ("tupe_r_tiny", False), "--remote-code": ("bert_a_tiny", True)}


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
    """(everything the child wrote to its pseudo-terminal, its exit status); a child still running after
    ``timeout`` seconds (waiting at a prompt) is killed."""
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
    return text, process.returncode


def outside_a_terminal(root, folder):
    result = subprocess.run([sys.executable, "-c", CHILD, folder], stdin=subprocess.PIPE, capture_output=True,
                            text=True, env=child_environment(root), cwd="/", timeout=120)
    return result.stdout + result.stderr, result.returncode


@pytest.mark.parametrize("how", [in_a_terminal, outside_a_terminal], ids=["terminal", "no terminal"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_tokenizer_of_an_export_loads_without_a_prompt_or_a_warning(exports, family, how):
    root, folders = exports
    output, returncode = how(root, folders[family])
    assert returncode == 0, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("RESULT "), output
    result = json.loads(lines[0][len("RESULT "):])
    assert result["text"] == "The history of <mask> in 1990 ." and result["start"] == "<mask> of it"


@pytest.mark.parametrize("family", ["roberta", "deberta-v2"])
def test_the_card_of_a_native_export_loads_the_tokenizer_with_auto_tokenizer(exports, family):
    root, folders = exports
    with open(os.path.join(folders[family], "README.md"), encoding="utf-8") as card:
        assert "tokenizer = AutoTokenizer.from_pretrained(FOLDER)\n" in card.read()
