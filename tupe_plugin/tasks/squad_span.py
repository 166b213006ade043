"""``--task squad_span``: extractive question answering (SQuAD v1.1 / v2.0) on the features written by
``tupe-prepare-squad`` (layout in :mod:`tupe_plugin.squad.features`).

The model gets a span head (start/end logits per token, :class:`~tupe_plugin.models.span_head.
SpanPredictionHead`); the targets are the start and end token of the answer, ``<s>`` for none.
"""

import contextlib
import logging
import os
from dataclasses import dataclass, field

import numpy as np
from fairseq.data import (
    Dictionary,
    IdDataset,
    NestedDictionaryDataset,
    NumelDataset,
    NumSamplesDataset,
    RawLabelDataset,
    RightPadDataset,
    SortDataset,
    data_utils,
)
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II, MISSING, OmegaConf, open_dict

from ..squad.features import load_spans, spans_path, tokens_prefix
from ..user_input.path_checks import path_problem

logger = logging.getLogger(__name__)


@dataclass
class SquadSpanConfig(FairseqDataclass):
    data: str = field(default=MISSING, metadata={"help": "folder written by tupe-prepare-squad"})
    span_head_name: str = field(default="squad_span", metadata={"help": "name of the model's span head"})
    max_positions: int = field(
        default=512, metadata={"help": "the pre-training --max-positions (features must fit)"}
    )
    no_shuffle: bool = field(default=False)
    seed: int = II("common.seed")


@register_task("squad_span", dataclass=SquadSpanConfig)
class SquadSpanTask(FairseqTask):
    def __init__(self, cfg, dictionary):
        super().__init__(cfg)
        self.dictionary = dictionary

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        path = os.path.join(cfg.data, "dict.txt")
        if problem := path_problem(path):
            raise FileNotFoundError(
                f"{path}: {problem}; prepare the data with tupe-prepare-squad --out {cfg.data}"
            )
        dictionary = Dictionary.load(path)
        dictionary.add_symbol("<mask>")  # as masked_lm did in pre-training: same vocabulary size
        return cls(cfg, dictionary)

    def load_dataset(self, split, combine=False, **kwargs):
        tokens = data_utils.load_indexed_dataset(tokens_prefix(self.cfg.data, split), self.dictionary)
        if tokens is None or not os.path.isfile(spans_path(self.cfg.data, split)):
            raise FileNotFoundError(
                f"{tokens_prefix(self.cfg.data, split)}.bin or {spans_path(self.cfg.data, split)} missing: "
                f"tupe-prepare-squad writes the {split} split into --out {self.cfg.data}"
            )
        spans = load_spans(self.cfg.data, split)
        if len(spans) != len(tokens):
            raise ValueError(f"{self.cfg.data}: {len(tokens)} {split} features but {len(spans)} spans; "
                             "prepare the folder again")
        longest = int(tokens.sizes.max())
        if longest > self.cfg.max_positions:
            raise ValueError(
                f"{self.cfg.data}: {split} features of {longest} tokens exceed --max-positions "
                f"{self.cfg.max_positions}; prepare with tupe-prepare-squad --max-seq-length "
                f"{self.cfg.max_positions} or less"
            )
        dataset = NestedDictionaryDataset(
            {
                "id": IdDataset(),
                "net_input": {
                    "src_tokens": RightPadDataset(tokens, pad_idx=self.dictionary.pad()),
                    "src_lengths": NumelDataset(tokens, reduce=False),
                },
                "target": RawLabelDataset(spans.tolist()),
                "nsentences": NumSamplesDataset(),
                "ntokens": NumelDataset(tokens, reduce=True),
            },
            sizes=[tokens.sizes],
        )
        if not self.cfg.no_shuffle:
            with data_utils.numpy_seed(self.cfg.seed):
                dataset = SortDataset(dataset, sort_order=[np.random.permutation(len(dataset))])
        logger.info("loaded %s: %d features", split, len(dataset))
        self.datasets[split] = dataset
        return dataset

    def build_model(self, cfg, from_checkpoint=False):
        with open_dict(cfg) if OmegaConf.is_config(cfg) else contextlib.ExitStack():
            cfg.max_positions = self.cfg.max_positions
        model = super().build_model(cfg, from_checkpoint)
        if not hasattr(model, "register_span_head"):
            raise ValueError(f"--task squad_span needs a tupe_plugin --arch; {cfg.arch} has no span head")
        model.register_span_head(self.cfg.span_head_name)
        return model

    def max_positions(self):
        return self.cfg.max_positions

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary
