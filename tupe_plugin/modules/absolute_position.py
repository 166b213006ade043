"""Absolute position embeddings added to the word embeddings at the input (BERT-A, seed 001 Eq. 3)."""

import torch
from torch import nn

ABS_POS_CHOICES = ("none", "learned")


class LearnedAbsolutePosition(nn.Module):
    """A learned table of ``max_positions`` vectors; position t = 0 is the first token (Devlin et al.)."""

    def __init__(self, max_positions, embed_dim):
        super().__init__()
        self.max_positions = max_positions
        self.weight = nn.Parameter(torch.empty(max_positions, embed_dim))
        nn.init.normal_(self.weight, mean=0.0, std=0.02)

    def forward(self, seq_len):
        if seq_len > self.max_positions:
            raise ValueError(
                f"input of {seq_len} tokens is longer than the {self.max_positions} learned "
                "absolute positions; raise --max-positions (pre-training) or truncate the input "
                "(--tokens-per-sample / --max-positions at fine-tuning)"
            )
        return self.weight[:seq_len]


def build_absolute_position(kind, max_positions, embed_dim):
    if kind == "learned":
        return LearnedAbsolutePosition(max_positions, embed_dim)
    return None
