"""Span prediction head for extractive question answering (SQuAD; BERT's start/end vectors, seed 000 §4).

One linear map from each token's final hidden state to two scores: the logit of the token starting the
answer and the logit of it ending the answer. The first token (``<s>``) stands for "no answer" (SQuAD v2.0).
"""

import torch.nn as nn


class SpanPredictionHead(nn.Module):
    def __init__(self, input_dim):
        super().__init__()
        self.out_proj = nn.Linear(input_dim, 2)

    def forward(self, features):
        """(B, T, C) features -> start and end logits, each (B, T)."""
        start_logits, end_logits = self.out_proj(features).unbind(dim=-1)
        return start_logits, end_logits
