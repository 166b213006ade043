"""The position matrices of a plugin model, as plain tensors.

TUPE Fig. 5 (Ke, He, Liu, "Rethinking Positional Encoding in Language Pre-training", arXiv 2006.15595);
Fig. 2, 3, 6, 7 of Wang, Shang, Lioma, Jiang, Yang, Liu, Simonsen, "On Position Embeddings in BERT",
ICLR 2021; DeBERTa's position terms (He, Liu, Gao, Chen, arXiv 2006.03654, Eq. 4). Each function takes a
:class:`~tupe_plugin.models.TupeRobertaModel` and returns its matrix,
or None when the model has no such part (e.g. ``bert_nope`` has no position table); which parts a model
has is asked of its :class:`~tupe_plugin.encodings.position_config.PositionConfig`. Nothing here trains,
draws or measures. Shapes: H heads, T positions 0..T-1 (position 0 holds <s> = [CLS]).
"""

import torch

from ..checkpoints.vocabulary import word_indices
from ..encodings.sinusoid import Sinusoid, initial_frequencies


def positional_encoder(model):
    """The plugin's encoder stack (embeddings, shared positional term, layers)."""
    return model.encoder.sentence_encoder


def position_config(model):
    """The model's :class:`~tupe_plugin.encodings.position_config.PositionConfig`."""
    return positional_encoder(model).config


def has_learned_table(model):
    """True when a learned table fixes the longest input (learned APE, TUPE / BERT-A^d table)."""
    return position_config(model).learned_tables


@torch.no_grad()
def content_free_term(model, seq_len):
    """(H, T, T): everything content-free every layer adds to its logits, after the [CLS] reset.

    The TUPE untied term (TUPE Eq. 7, 10, 11), BERT-A^d's (pU^Q)(pU^K)^T / sqrt(4 d_h) and the
    T5 bias, each with the scale attention applies; None when the model has none of them (Shaw
    vectors depend on the query and are not part of it).
    """
    term = positional_encoder(model).positional_term.content_free(seq_len).dense()
    return None if term is None else term.float()


def has_cls_reset(model):
    return position_config(model).cls_reset_applies


@torch.no_grad()
def relative_bias_by_distance(model, seq_len):
    """(offsets (2T-1,), bias (H, 2T-1)) for j - i = -(T-1)..T-1 of the model's relative bias (T5:
    b[h, bucket(j - i)], ``config.t5_bias``; ALiBi: -m_h |j - i|, ``config.alibi``), or None without one."""
    bias = positional_encoder(model).positional_term.relative_bias
    if bias is None:
        return None
    offsets, per_offset = bias.per_offset(seq_len)
    return offsets.cpu(), per_offset.float()


@torch.no_grad()
def rotary_offset_matrix(model, seq_len):
    """(T, T): psi(j - i) = (2 / d_h) sum_k cos(theta_k (j - i)), the expected RoPE logit
    q_i . R_{j-i} q_j of identical, isotropic content (1 at offset 0), or None without RoPE. theta_k is
    the angle per position the model rotates by, scaled as --rotary-scaling says."""
    rotary = positional_encoder(model).positional_term.rotary
    if rotary is None:
        return None
    frequencies = rotary.angles(rotary.sinusoid.frequencies.new_ones(())).detach().double().cpu()
    positions = torch.arange(seq_len, dtype=torch.float64)
    offsets = positions[None, :] - positions[:, None]
    return torch.cos(offsets[..., None] * frequencies).mean(-1)


@torch.no_grad()
def absolute_position_vectors(model, seq_len):
    """(kind, (T, d) vectors) of the absolute positions, or None.

    kind: the config's ``absolute`` (``learned`` / ``sinusoidal`` / ``learnable-sinusoidal``) for a PE
    added at the input, or ``untied`` for TUPE's / BERT-A^d's table p = LayerNorm(P) (TUPE Eq. 7).
    """
    encoder = positional_encoder(model)
    if encoder.embed_positions is not None:
        return encoder.config.absolute, encoder.embed_positions(seq_len).float()
    untied = encoder.positional_term.untied_position
    if untied is not None:
        return "untied", untied.positions(seq_len).float()
    return None


@torch.no_grad()
def first_layer_position_correlation(model, seq_len):
    """(H, T, T): (P W^Q_h)(P W^K_h)^T * scale of the first layer (Wang et al. 2021 Fig. 7), or None.

    Only for a PE added at the input; P is the raw table as in the paper's figure (no input
    LayerNorm, no projection biases), the scale the one attention uses (1/sqrt(d_h)).
    """
    encoder = positional_encoder(model)
    if encoder.embed_positions is None:
        return None
    positions = encoder.embed_positions(seq_len).float()
    attention = encoder.layers[0].self_attn
    embed_dim, heads, head_dim = positions.size(1), attention.num_heads, attention.head_dim
    w_q, w_k, _ = attention.in_proj.weight.float().split(embed_dim, 0)
    q = (positions @ w_q.t()).view(seq_len, heads, head_dim).transpose(0, 1)
    k = (positions @ w_k.t()).view(seq_len, heads, head_dim).transpose(0, 1)
    return q @ k.transpose(1, 2) * encoder.config.scale


@torch.no_grad()
def relative_position_table(model):
    """(kind, (2K+1, d_h) table) of the Shaw vectors a_{-K}..a_K, or None; kind is the config's
    ``shaw_table`` (``learned`` / ``sinusoidal`` / ``learnable-sinusoidal``)."""
    shaw = positional_encoder(model).positional_term.shaw
    if shaw is None:
        return None
    return position_config(model).shaw_table, shaw.table().float()


@torch.no_grad()
def learnable_frequencies(model):
    """{name: (initial, learned)} frequency vectors of every learnable sinusoid (Wang et al. 2021 A.5)."""
    found = {}
    for name, module in positional_encoder(model).named_modules():
        if isinstance(module, Sinusoid) and module.learnable:
            learned = module.frequencies.detach().float().cpu()
            found[name] = (initial_frequencies(2 * learned.numel(), module.base), learned)
    return found


@torch.no_grad()
def identical_word_attention(model, dictionary, seq_len, samples, seed=0, batch_size=16):
    """(H, T, T): first-layer attention of sentences of one repeated word (Wang et al. 2021 §3.1, Eq. 5).

    Each sentence is one randomly drawn ordinary word repeated T times; the probabilities are
    averaged over ``samples`` sentences (words drawn with replacement).
    """
    vocabulary = word_indices(dictionary)
    if not vocabulary:
        raise ValueError("the dictionary holds no ordinary word to probe with")
    if samples < 1:
        raise ValueError(f"--probe-samples must be >= 1, got {samples}")
    generator = torch.Generator().manual_seed(seed)
    words = torch.tensor(vocabulary)[torch.randint(len(vocabulary), (samples,), generator=generator)]
    device = next(model.parameters()).device
    total = None
    was_training = model.training
    model.eval()
    try:
        for chunk in words.split(batch_size):
            tokens = chunk[:, None].expand(-1, seq_len).to(device)
            _, extra = model(tokens, features_only=True, need_attn=True)
            first_layer = extra["attn"][0].float().sum(0)
            total = first_layer if total is None else total + first_layer
    finally:
        model.train(was_training)
    return (total / samples).cpu()



@torch.no_grad()
def disentangled_profiles(model, dictionary, seq_len, samples, seed=0, batch_size=16):
    """(offsets (2T-1,), profiles (L, 2, H, 2T-1)) of DeBERTa's position terms, or None without them.

    For every layer l, profiles[l, 0] is the content-to-position term scale * q_i . K^r_delta(i,j) and
    profiles[l, 1] the position-to-content term scale * k_j . Q^r_delta(j,i) (He et al. 2021 Eq. 4), each
    averaged over the pairs (i, j) of one offset j - i and over ``samples`` sentences of T ordinary words
    drawn at random (with replacement), as the layer sees them in the model's forward.
    """
    encoder = positional_encoder(model)
    if encoder.positional_term.disentangled is None:
        return None
    vocabulary = word_indices(dictionary)
    if not vocabulary:
        raise ValueError("the dictionary holds no ordinary word to probe with")
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.tensor(vocabulary)[torch.randint(len(vocabulary), (samples, seq_len), generator=generator)]
    device = next(model.parameters()).device
    sums = [None] * len(encoder.layers)

    def accumulate(layer_index):
        def hook(attention, inputs):
            x, term = inputs[0], inputs[1]
            q, k, _ = attention.project(x)
            terms = torch.stack([t.float().sum(0) for t in attention.disentangled_terms(q, k, term)])
            sums[layer_index] = terms if sums[layer_index] is None else sums[layer_index] + terms
        return hook

    handles = [layer.self_attn.register_forward_pre_hook(accumulate(index))
               for index, layer in enumerate(encoder.layers)]
    was_training = model.training
    model.eval()
    try:
        for chunk in tokens.split(batch_size):
            model(chunk.to(device), features_only=True)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    mean = torch.stack(sums).cpu() / samples  # (L, 2, H, T, T)
    positions = torch.arange(seq_len)
    offset = positions[None, :] - positions[:, None]
    offsets = torch.arange(1 - seq_len, seq_len)
    profiles = torch.stack([mean[..., offset == m].mean(-1) for m in offsets], -1)
    return offsets, profiles
