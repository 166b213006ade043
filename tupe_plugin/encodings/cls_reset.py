"""The paper's [CLS] reset of a content-free bias without TUPE's untied term (Ke, He, Liu, "Rethinking
Positional Encoding in Language Pre-training", arXiv 2006.15595, §3.3, Eq. 9-11).

TUPE argues for the reset of any position-only term: the [CLS] token should not be tied to a position.
With ``--cls-reset paper`` and a ``--rel-pos`` bias (T5, ALiBi, KERPLE, Sandwich, FIRE) but no untied term,
there are no U^Q/U^K to build theta from, so theta_1 (correlations from [CLS], row 0) and theta_2 (to
[CLS], column 0 of the rows i != 0) are two learned scalars per head, starting at 0. They replace those
entries of the whole content-free term, which then is the bias (under the untied term, theta comes from
:mod:`.untied_position` and the bias is zeroed there instead).
"""

import torch
from torch import nn


class ClsReset(nn.Module):
    def __init__(self, num_heads):
        super().__init__()
        self.thetas = nn.Parameter(torch.zeros(num_heads, 2))

    def contribute(self, term, seq_len):
        """Replace row 0 of ``term.bias`` by theta_1 and column 0 of the other rows by theta_2."""
        first = torch.arange(seq_len, device=term.bias.device) == 0
        theta_1, theta_2 = (theta[:, None, None] for theta in self.thetas.to(term.bias.dtype).unbind(1))
        term.bias = torch.where(first[:, None], theta_1, torch.where(first[None, :], theta_2, term.bias))


def build_cls_reset(config):
    """The [CLS] reset with its own thetas of a :class:`~.position_config.PositionConfig`, or None."""
    return ClsReset(config.num_heads) if config.own_cls_thetas else None
