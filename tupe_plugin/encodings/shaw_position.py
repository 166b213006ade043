"""Shaw-style relative position vectors (Wang, Shang, Lioma, Jiang, Yang, Liu, Simonsen, "On Position
Embeddings in BERT", ICLR 2021, Eq. 4; Shaw, Uszkoreit, Vaswani, "Self-Attention with Relative Position
Representations", arXiv 1803.02155).

a_r in R^{d_h} for r = clip(j - i, -K, K), one table shared by all heads and layers, added to the
keys (score q_i . (k_j + a_{j-i})) and, unless keys-only, to the values
(out_i = sum_j alpha_ij (v_j + a_{j-i})). Tables: ``learned`` ((2K+1) x d_h), ``sinusoidal`` (fixed
sin/cos of the signed clipped distance, as NEZHA: Wei et al., "NEZHA: Neural Contextualized
Representation for Chinese Language Understanding", arXiv 1909.00204) or ``learnable-sinusoidal``.
The vectors depend on the query, so they are not content-free: the shared table and the (T, T) index
are handed over and each layer adds q . a_{j-i} (and the value term) itself.
"""

from dataclasses import dataclass

import torch
from torch import nn

from ..user_input.memory_limits import FLOAT32, trained_bytes
from .encoding import Encoding, option
from ..terms.parts import ClippedTable
from .sinusoid import Sinusoid

PREFIX = "shaw-"
TABLES = ("learned", "sinusoidal", "learnable-sinusoidal")


@dataclass(frozen=True)
class ShawOptions:
    shaw_max_distance: int = option(64, metavar="K",
                                    help="Shaw relative distances are clipped to [-K, K] (default 64)")
    shaw_keys_only: bool = option(False, help="add the Shaw vectors to the keys only, not to the values")

    @property
    def shaw_table(self):
        """The Shaw table kind (learned / sinusoidal / learnable-sinusoidal), or None."""
        return self.rel_pos[len(PREFIX):] if self.rel_pos.startswith(PREFIX) else None

    @property
    def shaw_learnable_frequencies(self):
        """Shaw vectors from sinusoids of learnable frequencies."""
        return self.shaw_table == "learnable-sinusoidal"

    @property
    def shaw_values(self):
        """Shaw vectors added to the values too: the probabilities are needed."""
        return self.shaw_table is not None and not self.shaw_keys_only


class ShawRelativePosition(nn.Module):
    """The table a_{-K}..a_K: learned (``learned=True``) or sinusoidal (fixed or ``learnable``
    frequencies); ``values``: added to the values too, not to the keys only."""

    def __init__(self, head_dim, max_distance=64, learned=True, learnable=False, values=True):
        super().__init__()
        if max_distance < 1:
            raise ValueError(f"--shaw-max-distance must be >= 1, got {max_distance}")
        self.max_distance = max_distance
        self.learned = learned
        self.values = values
        if learned:
            self.weight = nn.Parameter(torch.empty(2 * max_distance + 1, head_dim))
            nn.init.normal_(self.weight, mean=0.0, std=0.02)
        else:
            self.sinusoid = Sinusoid(head_dim, learnable=learnable)

    def table(self):
        """(2K+1, d_h): row r holds a_{r - K}."""
        if self.learned:
            return self.weight
        distances = torch.arange(-self.max_distance, self.max_distance + 1,
                                 device=self.sinusoid.frequencies.device)
        return self.sinusoid(distances)

    def index(self, seq_len, device):
        """(T, T) row of the table for each (query i, key j): clip(j - i, -K, K) + K."""
        return clipped_index(seq_len, self.max_distance, device)

    def contribute(self, term, forward):
        """Add the table, the (T, T) index into it, the row by offset j - i and whether values take the
        vectors to ``term`` (a :class:`~tupe_plugin.terms.parts.ClippedTable`)."""
        table = self.table()
        term.add(ClippedTable(table, self.index(forward.seq_len, table.device),
                              clipped_offsets(forward.seq_len, self.max_distance, table.device), self.values))


def clipped_index(seq_len, max_distance, device):
    """(T, T) distance index of (query i, key j): clip(j - i, -K, K) + K."""
    positions = torch.arange(seq_len, device=device)
    return (positions[None, :] - positions[:, None]).clamp(-max_distance, max_distance) + max_distance


def clipped_offsets(seq_len, max_distance, device):
    """(2T - 1,) row of the table by offset o = j - i, from -(T - 1) to T - 1: clip(o, -K, K) + K (the kernels
    that read the table by offset)."""
    offsets = torch.arange(1 - seq_len, seq_len, device=device)
    return offsets.clamp(-max_distance, max_distance) + max_distance


def build_shaw(config):
    """The Shaw table of a :class:`~.position_config.PositionConfig` that uses it."""
    return ShawRelativePosition(config.head_dim, config.shaw_max_distance, config.shaw_table == "learned",
                                config.shaw_learnable_frequencies, config.shaw_values)


def check_shaw(config):
    errors = []
    if config.shaw_max_distance < 1:
        errors.append(f"--shaw-max-distance must be >= 1, got {config.shaw_max_distance}")
    if config.shaw_table != "learned" and config.head_dim % 2:
        errors.append(f"--rel-pos {config.rel_pos} needs an even head dimension, got {config.head_dim}")
    return errors


def shaw_sizes(config, forward):
    """Its table (learned: in training; sinusoidal: computed each forward) and q's products with all its rows,
    (B, H, T, 2K + 1) a layer, which the keys' term is gathered from."""
    rows = 2 * config.shaw_max_distance + 1
    table = rows * config.head_dim
    table_bytes = trained_bytes(table) if config.shaw_table == "learned" else 3 * table * FLOAT32
    products = forward.tokens * config.num_heads * rows
    return [("shaw_max_distance", config.shaw_max_distance,
             f"Shaw table ({rows} rows of {config.head_dim}) and the queries' products with its rows "
             f"({forward.describe()} x {config.num_heads} heads x {rows})",
             table_bytes + products * FLOAT32, "64 is the default")]


SHAW = Encoding(
    name="shaw", label="Shaw's relative vectors", kind="relative_vectors", family="rel_pos",
    choices=tuple(PREFIX + table for table in TABLES),
    choices_help="shaw-* = Shaw vectors a_clip(j-i) added to keys and values, one table shared by heads and "
    "layers, learned / fixed sinusoidal / learnable-frequency sinusoidal (Wang et al. 2021 Eq. 4)",
    summary="vectors a_clip(j - i) of a table shared by heads and layers, added to the keys and values",
    citation="Shaw, Uszkoreit, Vaswani, arXiv 1803.02155; Wang et al., On Position Embeddings in BERT, "
    "ICLR 2021",
    slot="shaw", options=ShawOptions, build=build_shaw, check=check_shaw, sizes=shaw_sizes,
    export_names=(("weight", "shaw_table"), ("sinusoid.frequencies", "shaw_frequencies")),
    exported=True, parts=(ClippedTable,),
)
