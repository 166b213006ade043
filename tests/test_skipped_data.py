"""A training run that would skip more than 1% of its tokens for being too long stops, saying how much."""

import warnings

import numpy as np
import pytest
import torch
from conftest import _Task, build_model, make_dictionary
from fairseq import options, tasks
from fairseq.data import Dictionary, FairseqDataset, indexed_dataset
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from tupe_plugin.policies.skipped_data_check import SkippedDataError
from tupe_plugin.models import TupeRobertaModel


def masked_lm_train_split(data, *flags):
    argv = [str(data), "--task", "masked_lm", "--arch", "tupe_r_tiny", "--batch-size", "2", *map(str, flags)]
    cfg = convert_namespace_to_omegaconf(
        options.parse_args_and_arch(options.get_training_parser(), input_args=argv))
    task = tasks.setup_task(cfg.task)
    task.allow_skipped_data = False  # what building a plugin model without --allow-skipped-data does
    task.load_dataset("train")
    dataset = task.dataset("train")
    return task, dataset, np.arange(len(dataset))


@pytest.mark.parametrize("mode, tokens_per_sample",
                         [("complete", 16), ("complete", 48), ("complete_doc", 32)])
def test_whole_lines_longer_than_the_blocks_stop_the_run_saying_how_much(mode, tokens_per_sample,
                                                                         wikitext_bin):
    task, dataset, indices = masked_lm_train_split(
        wikitext_bin, "--sample-break-mode", mode, "--tokens-per-sample", tokens_per_sample)
    with pytest.raises(SkippedDataError,
                       match=rf"\d+\.\d% of the tokens of train \([\d,]+ of [\d,]+ samples\) "
                             f"are longer than max_positions={tokens_per_sample}.*"
                             f"--sample-break-mode {mode} keeps whole lines.*--allow-skipped-data"):
        task.filter_indices_by_size(indices, dataset, tokens_per_sample, ignore_invalid_inputs=True)


def test_fixed_blocks_skip_nothing_and_train(wikitext_bin):
    task, dataset, indices = masked_lm_train_split(wikitext_bin, "--tokens-per-sample", 16)
    assert len(task.filter_indices_by_size(indices, dataset, 16, ignore_invalid_inputs=True)) == len(indices)


def test_allow_skipped_data_trains_on_the_rest(wikitext_bin):
    task, dataset, indices = masked_lm_train_split(
        wikitext_bin, "--sample-break-mode", "complete", "--tokens-per-sample", 16)
    task.allow_skipped_data = True  # what building the model with --allow-skipped-data does (tested below)
    kept = task.filter_indices_by_size(indices, dataset, 16, ignore_invalid_inputs=True)
    assert 0 < len(kept) < len(indices)


@pytest.mark.parametrize("allow", [True, False])
def test_the_model_flag_allow_skipped_data_reaches_the_task(allow):
    task = _Task(make_dictionary(), 32)
    model = build_model("tupe_r_tiny", allow_skipped_data=allow)
    TupeRobertaModel.build_model(model.args, task)
    assert task.allow_skipped_data is allow


class Sized(FairseqDataset):
    def __init__(self, sizes, dtype=np.int64):
        self.sizes = np.array(sizes, dtype=dtype)

    def __getitem__(self, index):
        return index

    def __len__(self):
        return len(self.sizes)

    def num_tokens(self, index):
        return self.sizes[index]

    def size(self, index):
        return self.sizes[index]


class Task(tasks.FairseqTask):
    """A task a plugin model was built for (``allow_skipped_data`` set), or another model's (None)."""

    def __init__(self, allow_skipped_data=False):
        self.datasets = {}
        if allow_skipped_data is not None:
            self.allow_skipped_data = allow_skipped_data


@pytest.mark.parametrize("long_samples, refused", [(1, False), (3, True), (100, True)])
def test_only_more_than_one_percent_of_the_tokens_stops_the_run(long_samples, refused):
    sizes = [10] * (1000 - long_samples) + [50] * long_samples   # 1 long: 0.5% of the tokens, 3: 1.5%
    dataset, indices = Sized(sizes), np.arange(1000)
    task = Task()
    if refused:
        with pytest.raises(SkippedDataError,
                           match=f"of the tokens of the data \\({long_samples} of 1,000 samples\\)"):
            task.filter_indices_by_size(indices, dataset, 20, ignore_invalid_inputs=True)
    else:
        assert len(task.filter_indices_by_size(indices, dataset, 20, ignore_invalid_inputs=True)) == 999


def test_validation_without_skip_flag_keeps_fairseqs_own_error():
    with pytest.raises(Exception, match="skip this example with --skip-invalid-size-inputs-valid-test"):
        Task().filter_indices_by_size(np.arange(3), Sized([10, 50, 10]), 20, ignore_invalid_inputs=False)


def test_the_tasks_of_other_models_skip_long_samples_as_fairseq_does():
    dataset = Sized([10] * 900 + [50] * 100)   # 36% of the tokens too long for max_positions 20
    kept = Task(allow_skipped_data=None).filter_indices_by_size(np.arange(1000), dataset, 20,
                                                                ignore_invalid_inputs=True)
    assert len(kept) == 900


def test_token_counts_beyond_uint16_are_exact():
    sizes = [60_000] * 99 + [65_000]             # fairseq keeps sizes below 65,536 as uint16
    with pytest.raises(SkippedDataError, match=r"^1\.1% of the tokens of the data \(1 of 100 samples\)"):
        Task().filter_indices_by_size(np.arange(100), Sized(sizes, dtype=np.uint16), 64_000,
                                      ignore_invalid_inputs=True)


def binarize(folder, lines):
    """A train split of ``lines`` (lists of word indices in w0..w9), as fairseq-preprocess writes it."""
    dictionary = Dictionary()
    for word in range(10):
        dictionary.add_symbol(f"w{word}")
    folder.mkdir()
    dictionary.save(str(folder / "dict.txt"))
    builder = indexed_dataset.MMapIndexedDatasetBuilder(str(folder / "train.bin"), dtype=np.uint16)
    for line in lines:
        tokens = [dictionary.index(f"w{word}") for word in line] + [dictionary.eos()]
        builder.add_item(torch.IntTensor(tokens))
    builder.finalize(str(folder / "train.idx"))
    return folder


@pytest.mark.parametrize("words", [65_534, 70_000])   # with </s> and <s>: 65,536 and 70,002 tokens
def test_a_line_beyond_65535_tokens_is_counted_whole_without_overflow(words, tmp_path):
    """fairseq stored the sizes of --sample-break-mode complete blocks as uint16 whenever
    --tokens-per-sample was below 65,535: a line of 70,000 words was counted as 4,466 tokens (81.3%
    said instead of 98.6%), and one of 65,534 as 0, which fairseq's filter kept and the model got."""
    short = [[i % 10] * 20 for i in range(48)]            # 16 blocks of 3 lines: 16 x 64 tokens with <s>
    data = binarize(tmp_path / "bin", short + [[1] * words])
    task, dataset, indices = masked_lm_train_split(data, "--sample-break-mode", "complete",
                                                   "--tokens-per-sample", 64)
    share = 100 * (words + 2) / (words + 2 + 16 * 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)   # no numpy overflow on the way
        with pytest.raises(SkippedDataError,
                           match=rf"^{share:.1f}% of the tokens of train \(1 of 17 samples\)"):
            task.filter_indices_by_size(indices, dataset, 64, ignore_invalid_inputs=True)
