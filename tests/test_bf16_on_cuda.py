"""fairseq-train --bf16 on a CUDA machine trains in bfloat16 on the GPU, not on fairseq's TPU path (which
its command line implies from --bf16 and which fails without torch_xla): the implied tpu is dropped before
fairseq-train's call_main, for every model (a fix of fairseq's, tupe_plugin/fairseq_fixes/bf16_on_cuda.py).
CUDA is pretended here; the GPU run itself is benchmarks/gpu_checks.sh's fairseq-train step."""

import importlib.util

import pytest
import torch
from conftest import REPO
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils

import tupe_plugin.fairseq_fixes.bf16_on_cuda  # noqa: F401  (installed with the plugin; named for clarity)


def training_config(*flags):
    """The config fairseq-train builds from its command line (a RoBERTa run: the fix is for every model)."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=[
        REPO, "--user-dir", "tupe_plugin", "--task", "masked_lm", "--arch", "roberta_base", *flags])
    return convert_namespace_to_omegaconf(args)


def tpu_reaching_main(cfg):
    seen = {}

    def main(cfg):
        seen.update(common=cfg.common.tpu, distributed=cfg.distributed_training.tpu)

    distributed_utils.call_main(cfg, main)
    return seen


@pytest.fixture
def cuda_without_xla(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "torch_xla" else find_spec(name, *args))


def test_bf16_on_cuda_without_torch_xla_trains_on_the_gpu(cuda_without_xla):
    cfg = training_config("--bf16")
    assert cfg.common.tpu  # fairseq's implication, which the fix undoes
    assert tpu_reaching_main(cfg) == {"common": False, "distributed": False}
    assert cfg.common.bf16


def test_bf16_with_cpu_is_left_to_fairseq(cuda_without_xla):
    assert tpu_reaching_main(training_config("--bf16", "--cpu"))["common"]


def test_bf16_where_torch_xla_is_installed_keeps_fairseqs_tpu_path(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: object() if name == "torch_xla" else find_spec(name, *args))
    assert tpu_reaching_main(training_config("--bf16"))["common"]


def test_a_run_without_bf16_is_unchanged(cuda_without_xla):
    assert tpu_reaching_main(training_config("--fp16")) == {"common": False, "distributed": False}
