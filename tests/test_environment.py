"""The installed environment is consistent: every package in the virtualenv imports, transformers' model
classes included (torchaudio, which ve-fairseq pulls in and which does not load against the pinned torch,
is left out by ``make install``)."""

import subprocess
import sys

# Each distribution's top-level modules, imported one after the other in a fresh interpreter. setuptools
# comes first (its distutils shim must precede any import of distutils) and torch second (the compiled
# extensions of fairseq link against the libraries `import torch` loads); private names are skipped.
IMPORT_EVERY_PACKAGE = """
import importlib, importlib.metadata, warnings
warnings.simplefilter("ignore")
import setuptools, torch
failed = []
for name, distributions in sorted(importlib.metadata.packages_distributions().items()):
    if name.startswith("_") or not name.isidentifier():
        continue
    try:
        importlib.import_module(name)
    except BaseException as error:
        failed.append(f"{name} ({', '.join(distributions)}): {type(error).__name__}: {error}")
print("\\n".join(failed))
"""


def run_python(code):
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_every_installed_package_imports():
    assert run_python(IMPORT_EVERY_PACKAGE).strip() == ""


def test_transformers_model_classes_import():
    code = "from transformers import BertModel, RobertaModel, DebertaV2Model; print(BertModel.__name__)"
    assert run_python(code).strip() == "BertModel"

