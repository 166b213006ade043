"""The paper's [CLS] reset of a content-free bias without TUPE's untied term (Ke, He, Liu, "Rethinking
Positional Encoding in Language Pre-training", arXiv 2006.15595, §3.3, Eq. 9-11).

TUPE argues for the reset of any position-only term: the [CLS] token should not be tied to a position.
With ``--cls-reset paper`` and a ``--rel-pos`` bias (T5, ALiBi, KERPLE, Sandwich, FIRE) but no untied term,
there are no U^Q/U^K to build theta from, so theta_1 (correlations from [CLS], row 0) and theta_2 (to
[CLS], column 0 of the rows i != 0) are two learned scalars per head, starting at 0. They replace those
entries of the whole content-free term, which then is the bias (under the untied term, theta comes from
:mod:`.untied_position` and the bias is zeroed there instead).
"""

from dataclasses import replace

import torch
from torch import nn

from ..terms.parts import OffsetRows


class ClsReset(nn.Module):
    def __init__(self, num_heads):
        super().__init__()
        self.thetas = nn.Parameter(torch.zeros(num_heads, 2))

    def contribute(self, term, forward):
        """Set the reset of ``term``'s bias of the offset: theta_1 replaces its row 0, theta_2 column 0 of the
        other rows (the [CLS] values of its :class:`~tupe_plugin.terms.parts.OffsetRows`)."""
        offset = term.get(OffsetRows)
        term.put(replace(offset, cls=self.thetas.to(offset.rows.dtype)))


def build_cls_reset(config):
    """The [CLS] reset with its own thetas of a :class:`~.position_config.PositionConfig`, or None."""
    return ClsReset(config.num_heads) if config.own_cls_thetas else None
