"""Randomized positional encodings (Ruoss, Delétang, Genewein, Grau-Moya, Csordás, Bennani, Legg, Veness,
"Randomized Positional Encodings Boost Length Generalization of Transformers", ACL 2023, arXiv 2305.16843,
§3).

In training, each sequence of T tokens takes as its positions an ordered sample of T distinct integers of
[0, L), drawn anew for every sequence, instead of 0..T-1; at evaluation its positions are 0..T-1. The
encodings indexed by position (the absolute tables, RoPE's angles) then read the sampled positions, so that
every position up to L - 1 is seen in training and an evaluation on sequences longer than the training's,
up to L, reads only positions the model was trained on. No parameters: the encoding changes the positions
the others read, and at evaluation the model is its other encodings alone (exported as they are).

The draw takes torch's global generator on the forward's device, which fairseq seeds at every update: a
run, and a run resumed from its checkpoint, draw the same positions.
"""

from dataclasses import dataclass

import torch

from .encoding import Encoding, flag_name, option

FLAG = flag_name("randomized_positions")
# bytes a sampled slot takes in one draw: the float32 key of each of the L positions and its int64 rank
SLOT_BYTES = 4 + 8


@dataclass(frozen=True)
class RandomizedPositionsOptions:
    randomized_positions: int = option(
        0, metavar="L",
        help="randomized positions (Ruoss et al. 2023): in training each sequence of T tokens takes a sorted "
        "sample of T distinct positions of [0, L) (L >= T), read by the absolute tables and RoPE; 0..T-1 at "
        "evaluation; 0 = off")


def sample_positions(config, forward):
    """(B, T) positions: for each sequence a sorted sample of T distinct integers of [0, L), uniform over
    the T-subsets (the first T of a random permutation of [0, L), sorted), one draw per sequence."""
    length, seq_len = config.randomized_positions, forward.seq_len
    if seq_len > length:
        raise ValueError(f"{FLAG} {length} samples the T positions of each sequence from [0, {length}) and "
                         f"this batch has T = {seq_len} tokens; use {FLAG} of at least the longest training "
                         f"sequence ({seq_len}), e.g. 4 x --tokens-per-sample")
    keys = torch.rand(forward.batch, length, device=forward.positions.device)
    return keys.argsort(-1)[:, :seq_len].sort(-1).values


def check_randomized(config):
    """The encodings it samples positions for read them; a learned table has a row for each."""
    length, errors = config.randomized_positions, []
    others = [encoding for encoding in config.encodings() if encoding.kind != "positions"]
    for encoding in others:
        if not encoding.reads_positions:
            errors.append(f"{FLAG} {length} samples the positions of each sequence in training and "
                          f"{encoding.label} ({encoding.selection(config)}) is built for positions 0..T-1, "
                          f"not those; drop {FLAG} or {flag_name(encoding.family)}")
    if not any(encoding.reads_positions for encoding in others):
        errors.append(f"{FLAG} {length} samples the positions of the encodings indexed by position "
                      f"({_readers()}) and the model has none; add one (e.g. --rotary fixed) or drop {FLAG}")
    if config.learned_absolute_table and length > config.max_positions:
        errors.append(f"{FLAG} {length} samples positions up to {length - 1} and --abs-pos learned has "
                      f"--max-positions {config.max_positions} rows; use {FLAG} <= {config.max_positions} "
                      f"or --max-positions {length}")
    return errors


def _readers():
    """The encodings that read the positions of each sequence, as their flags select them."""
    from .registry import ENCODINGS

    return ", ".join(f"{encoding.label}: {encoding.describe_selection()}" for encoding in ENCODINGS
                     if encoding.reads_positions)


def negative_length(config):
    """0 is off; a negative L selects nothing and is refused."""
    length = config.randomized_positions
    return [f"{FLAG} must be >= 0 (0 = off), got {length}"] if length < 0 else []


def draw_size(config, forward):
    """One draw keys and ranks the L positions for each of the B sequences."""
    length = config.randomized_positions
    return [("randomized_positions", length,
             f"the draw of randomized positions ({forward.sequences} sequences x {length} positions)",
             forward.sequences * length * SLOT_BYTES,
             "a few times the longest evaluation length, e.g. 4096")]


def exported_as_its_base(config):
    """At evaluation the positions are 0..T-1: the model is the encodings that read them, exported as the
    transformers classes that compute them."""
    types, whys = [], []
    for encoding in config.encodings():
        if encoding.reads_positions:
            found, why = encoding.native_types(config)
            types += found
            whys += [why] if why else []
    if types:
        return tuple(dict.fromkeys(types)), None
    return None, "; ".join(whys) or "transformers has no class computing the encodings reading its positions"


RANDOMIZED = Encoding(
    name="randomized", label="randomized positions", kind="positions", learned=False,
    family="randomized_positions", choices=(), choices_help="",
    selects=lambda length: (length or 0) > 0,
    summary="in training, each sequence's positions a sorted random sample of [0, L), read by the encodings "
    "indexed by position; 0..T-1 at evaluation",
    citation="Ruoss, Delétang, Genewein, Grau-Moya, Csordás, Bennani, Legg, Veness, Randomized Positional "
    "Encodings Boost Length Generalization of Transformers, ACL 2023, arXiv 2305.16843",
    options=RandomizedPositionsOptions, check=check_randomized, unused_errors=negative_length,
    sizes=draw_size, positions=sample_positions, exported=True, hf_native=exported_as_its_base,
)
