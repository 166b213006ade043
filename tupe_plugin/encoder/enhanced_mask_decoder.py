"""DeBERTa's Enhanced Mask Decoder (He, Liu, Gao, Chen, "DeBERTa: Decoding-enhanced BERT with Disentangled
Attention", arXiv 2006.03654, §3.2): absolute positions enter right after the Transformer layers, before the
softmax of masked-token prediction, and nowhere else.

As the authors' released code builds it (the masked-LM head's ``emd_context_layer``, used when no absolute
position is added at the input): H is the output of the second-to-last layer and P the learned absolute
position embeddings of positions 0..T-1. The last layer, its weights shared, is applied n times
(``--deberta-emd-layers``, 2 as released): the first pass reads its queries from Q_0 = H + P, every pass its
keys and values from H, and Q_{t+1} = layer(query=Q_t, key/value=H); the residual and LayerNorms act on the
query stream, and the layer's relative terms are computed as usual (content-to-position with the query's
content, position-to-content with the key's). Q_n replaces the encoder output for the masked-LM head only:
the features (classification and span heads, analysis) stay the encoder's.
"""

from torch import nn

from ..encodings.absolute_position import LearnedAbsolutePosition


class EnhancedMaskDecoder(nn.Module):
    """P, a learned table of ``max_positions`` rows of the model dimension, and the number of passes."""

    def __init__(self, max_positions, embed_dim, passes=2):
        super().__init__()
        self.embed_positions = LearnedAbsolutePosition(max_positions, embed_dim)
        self.passes = passes

    def forward(self, layer, hidden, term, plan):
        """The query stream Q_n (B, T, C) after ``passes`` applications of ``layer`` to ``hidden`` = H
        (B, T, C), the input of the encoder's last layer, with the forward's positional ``term`` and
        attention ``plan``."""
        query = hidden + self.embed_positions(hidden.size(1))
        for _ in range(self.passes):
            query, _ = layer(hidden, term, plan, query=query)
        return query


def build_enhanced_mask_decoder(config):
    """The Enhanced Mask Decoder of a :class:`~tupe_plugin.encodings.position_config.PositionConfig`, or
    None."""
    passes = config.enhanced_mask_decoder_passes
    return None if passes is None else EnhancedMaskDecoder(config.max_positions, config.embed_dim, passes)
