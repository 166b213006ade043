"""DAPE, data-adaptive positional encoding (Zheng, Gao, Shi, Huang, Li, Xiong, Ren, Ng, Jiang, Li, Li, "DAPE:
Data-Adaptive Positional Encoding for Length Extrapolation", NeurIPS 2024, arXiv 2405.14722): a switch on
top of the bias of the distance (or none). Each layer computes, per query i and key j, from its scaled
logits S = q k^T / sqrt(d_h) and the content-free bias B every layer adds, both across the H heads:

    A_ij = S_ij + B_ij + f([S_ij; B_ij]),    f(x) = W_2 LeakyReLU(W_1 x + b_1) + b_2,

W_1 (W x 2H), W_2 (H x W) of the layer's own, PyTorch's default initialisation, W = ``--dape-width`` (32 in
the paper's configs). As the authors' released code, the MLP reads the scores first and the bias second,
sees the scores unmasked, and the padded keys are masked after it (the causal mask there, the key padding
here). B is the model's bias of |j - i| in both directions (the plugin's bidirectional biases), with the
[CLS] reset in force where one applies; without a bias B = 0.

The MLP is not linear in S: only the explicit attention path, where each layer's logits are whole, computes
it (``--attention-backend`` kernels refuse it naming DAPE).
"""

from dataclasses import dataclass

import torch.nn.functional as F
from torch import nn

from ..terms.parts import LayerTerm
from .encoding import Encoding, option

NAME = "dape"
FLOAT32 = 4
TRAINING_COPIES = 4  # a parameter's value, its gradient and Adam's two moments


@dataclass(frozen=True)
class DapeOptions:
    dape: bool = option(
        False,
        help="DAPE (Zheng et al. 2024): each layer adds f([logits; B]) to its logits, f a per-layer MLP "
        "across the heads of the scaled logits and the content-free bias B (of --rel-pos, or none)")
    dape_width: int = option(
        32, metavar="W", refused_unused=True,
        help="DAPE: the hidden width W of each layer's MLP, Linear(2H -> W) -> LeakyReLU -> Linear(W -> H) "
        "(32, the paper's)")


class DapeLayerTerm(nn.Module):
    """One layer's f: ``hidden`` (2H -> W), LeakyReLU(0.01), ``output`` (W -> H), applied to each (i, j) of
    [S; B] across the heads; the batch-free bias B goes through ``hidden`` once, not once per row."""

    def __init__(self, num_heads, width):
        super().__init__()
        self.num_heads = num_heads
        self.hidden = nn.Linear(2 * num_heads, width)
        self.output = nn.Linear(width, num_heads)

    def forward(self, logits, q, k, bias, padding):
        """f([logits; bias]) (B, H, T, T) of the scaled ``logits`` (B, H, T, T) and ``bias`` (H, T, T) or None
        (B = 0); ``q``, ``k`` and the key ``padding`` are not read: the padded keys are masked after."""
        weight = self.hidden.weight.to(logits.dtype)
        of_scores = F.linear(logits.permute(0, 2, 3, 1), weight[:, : self.num_heads])  # (B, T, T, W)
        of_bias = self.hidden.bias.to(logits.dtype)
        if bias is not None:
            of_bias = F.linear(bias.to(logits.dtype).permute(1, 2, 0), weight[:, self.num_heads:], of_bias)
        hidden = F.leaky_relu(of_scores + of_bias)
        return self.output(hidden.to(self.output.weight.dtype)).to(logits.dtype).permute(0, 3, 1, 2)


class DapeSwitch(nn.Module):
    """Adds the :class:`~tupe_plugin.terms.parts.LayerTerm` each layer computes with its
    :class:`DapeLayerTerm`; no parameters of its own."""

    def contribute(self, term, forward):
        term.add(LayerTerm(NAME))


def build_dape(config):
    return DapeSwitch()


def build_layer_term(config):
    """One layer's :class:`DapeLayerTerm` (a fresh one each call)."""
    return DapeLayerTerm(config.num_heads, config.dape_width)


def check_dape(config):
    """--dape-width, and what --dape may sit on: a content-free bias of the distance read as B (ALiBi,
    KERPLE, Sandwich, FIRE, T5) or none; refused beside terms that are not such a bias."""
    errors = []
    if config.dape_width < 1:
        errors.append(f"--dape-width must be >= 1, got {config.dape_width}")
    if config.relative_vectors:
        errors.append(f"--dape with --rel-pos {config.rel_pos}: its relative vectors depend on the content, "
                      "so there is no content-free bias B(i, j) for DAPE's MLP to read beside the logits; "
                      "use a bias of the distance (--rel-pos alibi, kerple-log, kerple-power, sandwich, "
                      "fire, t5) or none")
    if config.untied_table:
        errors.append(f"--dape with --untied-pos {config.untied_pos}: DAPE's MLP reads B(i, j) as a bias of "
                      "the distance j - i (Zheng et al. 2024), TUPE's term is of the absolute "
                      "positions i and j (BERT-A^d's shifts q and k themselves); use --untied-pos none")
    return errors


def dape_sizes(config, forward):
    """Each layer's MLP runs on every (i, j) of every sequence: B T^2 x W activations a layer, the linear
    layer's and the LeakyReLU's kept for the backward and a gradient of the same size; its weights in
    training."""
    cells, width, heads = forward.sequences * forward.length ** 2, config.dape_width, config.num_heads
    weights = forward.layers * (width * (2 * heads + 1) + heads * (width + 1))
    return [("dape_width", width,
             f"DAPE hidden layer ({forward.layers} layers x {forward.sequences} x {forward.length}^2 pairs "
             f"x {width} activations, 3 copies for the forward and backward, and its weights with their "
             "gradients and Adam's moments)",
             3 * forward.layers * cells * width * FLOAT32 + weights * TRAINING_COPIES * FLOAT32,
             "32, the paper's")]


DAPE = Encoding(
    name=NAME, label="DAPE", kind="layer", family="dape", choices=(), selects=bool,
    choices_help="--dape = each layer's MLP f([logits; B]) added to its logits (Zheng et al. 2024)",
    summary="each layer adds f([S; B]) to its logits, f an MLP across the heads of its scaled logits S and "
    "the content-free bias B",
    citation="Zheng, Gao, Shi, Huang, Li, Xiong, Ren, Ng, Jiang, Li, Li, DAPE: Data-Adaptive Positional "
    "Encoding for Length Extrapolation, NeurIPS 2024, arXiv 2405.14722",
    slot="dape", options=DapeOptions, build=build_dape, check=check_dape, sizes=dape_sizes,
    parts=(LayerTerm,), layer_module=build_layer_term,
)
