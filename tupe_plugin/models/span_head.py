"""Span prediction heads for extractive question answering (SQuAD; BERT's start/end vectors).

One linear map from each token's final hidden state to two scores: the logit of the token starting the
answer and the logit of it ending the answer. The first token (``<s>``) stands for "no answer" (SQuAD v2.0).
:class:`SpanHeadsMixin` gives a RoBERTa-style model named span heads, kept in checkpoints the way
fairseq keeps classification heads.
"""

import logging

import torch.nn as nn
from fairseq.utils import safe_getattr

logger = logging.getLogger(__name__)


class SpanPredictionHead(nn.Module):
    def __init__(self, input_dim):
        super().__init__()
        self.out_proj = nn.Linear(input_dim, 2)

    def forward(self, features):
        """(B, T, C) features -> start and end logits, each (B, T)."""
        start_logits, end_logits = self.out_proj(features).unbind(dim=-1)
        return start_logits, end_logits


class SpanHeadsMixin:
    """``span_heads`` (a ModuleDict), ``register_span_head`` and their checkpoint upgrade."""

    def init_span_heads(self):
        self.span_heads = nn.ModuleDict()

    def register_span_head(self, name):
        """Add a start/end span head (SQuAD) named ``name``, kept in checkpoints like classification heads."""
        if name not in self.span_heads:
            self.span_heads[name] = SpanPredictionHead(self.args.encoder_embed_dim)

    def span_logits(self, span_head_name, features):
        """That span head's ``(start_logits, end_logits)`` of (B, T, C) features, each (B, T)."""
        return self.span_heads[span_head_name](features)

    def upgrade_span_heads(self, state_dict, prefix):
        """Span heads in the checkpoint are loaded (``load_checkpoint_heads``) or dropped; heads the
        checkpoint lacks (fine-tuning from a masked-LM checkpoint) start from their initial weights."""
        head_prefix = prefix + "span_heads."
        for key in [k for k in state_dict if k.startswith(head_prefix)]:
            head_name = key[len(head_prefix):].split(".")[0]
            if head_name not in self.span_heads:
                if safe_getattr(self.args, "load_checkpoint_heads", False):
                    self.register_span_head(head_name)
                else:
                    logger.warning("deleting span head (%s) not present in the current model", key)
                    del state_dict[key]
        for key, value in self.span_heads.state_dict().items():
            state_dict.setdefault(head_prefix + key, value)
