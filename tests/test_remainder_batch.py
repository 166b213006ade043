"""fairseq's batcher keeps every example: the remainder after the last multiple of
--required-batch-size-multiple becomes a last batch (the compiled batcher dropped it)."""

import numpy as np
import pytest
import tupe_plugin  # noqa: F401  (installs the fix)
from fairseq.data import data_utils


@pytest.mark.parametrize("examples, max_sentences, max_tokens", [(35, 4, None), (35, 16, None), (5, 16, None),
                                                                 (35, None, 320)])
def test_every_example_is_in_one_batch_and_batches_keep_their_limits(examples, max_sentences, max_tokens):
    batches = data_utils.batch_by_size(np.arange(examples), lambda i: 10,
                                       num_tokens_vec=np.full(examples, 10), max_tokens=max_tokens,
                                       max_sentences=max_sentences, required_batch_size_multiple=8)
    assert sorted(np.concatenate(batches).tolist()) == list(range(examples))
    assert all(len(b) <= (max_sentences or max_tokens // 10) for b in batches)


def test_fairseqs_validation_batches_hold_every_block(pretrained_dir):
    """The masked-LM validation split in blocks of a length that leaves a remainder of 8."""
    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.options import get_validation_parser, parse_args_and_arch

    for length in range(60, 20, -1):
        args = parse_args_and_arch(get_validation_parser(), [
            str(pretrained_dir / "data-bin"), "--task", "masked_lm", "--tokens-per-sample", str(length),
            "--sample-break-mode", "none", "--batch-size", "4"])
        task = tasks.setup_task(convert_namespace_to_omegaconf(args).task)
        task.load_dataset("valid")
        dataset = task.dataset("valid")
        if len(dataset) % 8:
            break
    iterator = task.get_batch_iterator(dataset, max_sentences=4, required_batch_size_multiple=8)
    assert sum(len(batch) for batch in iterator.frozen_batches) == len(dataset)
