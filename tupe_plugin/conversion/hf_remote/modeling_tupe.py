"""A tupe-plugin encoder as a transformers model, written from the papers' formulas (``trust_remote_code``).

Self-contained: torch and transformers only; copied into every export by ``tupe-export-hf``. A BERT
encoder (post-LN, or pre-LN with ``pre_layer_norm``) whose attention logits are, per head h,

    scale * q_i . k_j  +  b_h(i, j)  [+ scale * q_i . a_{clip(j-i)}]

with the content-free term b shared by all layers:

* TUPE's untied term (Ke, He, Liu, arXiv 2006.15595, Eq. 7): scale * (p_i U^Q_h) . (p_j U^K_h),
  p = LayerNorm(P), scale 1/sqrt(2 d_h); its [CLS] reset (Eq. 9-11): row 0 is scale * theta_1, column 0
  of the other rows scale * theta_2, theta_k = (p_theta_k U^Q_h) . (p_theta_k U^K_h) of two learned
  vectors; the released code's form (``cls_reset`` "release"): the table has one more row, position t
  reads row t + 1 and the thetas are the self-correlations of rows 0 and 1. BERT-A^d (§4.3): p U^Q, p U^K
  added to the query and key instead, scale 1/sqrt(4 d_h).
* T5's bias b[h, bucket(j - i)] (TUPE Eq. 5 and 8; Raffel et al., arXiv 1910.10683), zeroed on row and
  column 0 under the [CLS] reset; in the release form its own buckets for pairs (i, 0) and (0, j).
* ALiBi (Press, Smith, Lewis, arXiv 2108.12409): -m_h |j - i|, one slope per side when asymmetric, learned
  as m = exp(a).
* KERPLE (Chi, Fan, Ramadge, Rudnicky, arXiv 2205.09921), of |j - i| for encoders: -r1_h log(1 + r2_h
  |j - i|) or -r1_h |j - i|^r2_h, r1, r2 learned per head; clamped in place to >= 0.01 (the exponent to
  [0.01, 2]) at every forward, as the authors' released code, or r = softplus(a), the exponent
  2 sigmoid(a) (``kerple_param`` softplus).
* Sandwich (Chi, Fan, Rudnicky, Ramadge, arXiv 2212.10356): S (sum_k cos(w_k (j - i)) - d'/2) / r_h, the
  inner product of the sinusoids of the stored frequencies w_k less its value at j = i, r_h = 8 (h + 1) / H.
* FIRE (Li et al., arXiv 2310.04418), of |j - i| for encoders: f(psi(|j - i|) / (psi(max(L, T - 1)) +
  1e-6)), psi(x) = log(1 + c x), f an MLP of one hidden ReLU layer (the sign of j - i a second input with
  ``fire_signed``), c = exp(a) and L learned, T the input's (padded) length; ``fire_normaliser`` length:
  psi(max(L, T)).
* Without the untied term, the paper's [CLS] reset replaces row 0 of the bias by theta_1 and column 0 of
  the other rows by theta_2, two learned scalars per head.

DeBERTa's disentangled attention (He, Liu, Gao, Chen, arXiv 2006.03654, Eq. 3-4, as the authors' released
code): the logits are (q_i . k_j + q_i . K^r_delta(i,j) + k_j . Q^r_delta(i,j)) / sqrt(3 d_h)
(Q^r_delta(j,i) with ``deberta_p2c`` paper, Eq. 4 as printed), delta(i, j) = clip(i - j, -k, k - 1) + k, or
clip(bucket(i - j) + N, 0, 2N - 1) with v2's N log buckets; P is one table of 2k (2N) rows shared by the
layers (LayerNorm-ed with ``deberta_table_norm``), Q^r = P W^{q,r} (+ b^{q,r}), K^r = P W^{k,r} (+ b^{k,r})
per layer (``deberta_rel_proj_bias``), or by the layer's content projections (``deberta_share_att_key``).
Its Enhanced Mask Decoder (§3.2, as released): the masked-LM head reads the last layer applied
``deberta_emd_layers`` times, its queries from Q_0 = H + P_abs, its keys and values from H, the input of the
last layer; the features stay the encoder's.

RoPE (Su et al., arXiv 2104.09864) rotates the pairs (2k, 2k+1) of q and k by theta_k t (``rotary_scaling``
linear: t / F; ntk: base F^(d_h/(d_h-2))). Shaw's vectors (Shaw, Uszkoreit, Vaswani, arXiv 1803.02155; Wang
et al., ICLR 2021, Eq. 4) add q_i . a_{clip(j-i)} to the logits and sum_j alpha_ij a_{clip(j-i)} to the
output. The absolute encodings (learned, or sinusoids [sin w_i t, cos w_i t] of fixed or learned w_i,
Vaswani et al., arXiv 1706.03762) are added to the word embeddings. Padding comes from ``attention_mask``:
padded keys get the most negative logit, padded positions are zeroed after the embeddings.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import (BaseModelOutput, MaskedLMOutput, QuestionAnsweringModelOutput,
                                           SequenceClassifierOutput)

from .configuration_tupe import TupeConfig


def gelu_accurate(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x.float()).type_as(x),
    "gelu_accurate": gelu_accurate,
    "gelu_fast": gelu_accurate,
    "relu": F.relu,
    "relu_squared": lambda x: F.relu(x).pow(2),
    "tanh": torch.tanh,
    "linear": lambda x: x,
}


def initial_frequencies(dim, base=10000.0, first=0):
    """w_k = base^(-2k/dim), k = first..first+dim/2-1."""
    return base ** (-torch.arange(2 * first, dim + 2 * first, 2, dtype=torch.float) / dim)


def sinusoids(positions, frequencies):
    """[.., sin(w_k x), cos(w_k x), ..] (pairs interleaved) of positions (...,), in float32."""
    angles = positions.float()[..., None] * frequencies.float()
    return torch.stack([angles.sin(), angles.cos()], -1).flatten(-2)


def t5_bucket(relative, num_buckets, max_distance):
    """T5's bidirectional bucket of relative = j - i: half the buckets per direction, the first half of
    each exact, the rest log-spaced up to max_distance (computed in float64 on the CPU)."""
    device = relative.device
    n = -relative.cpu()
    half = num_buckets // 2
    bucket = (n < 0).long() * half
    n = n.abs()
    exact = half // 2
    log_ratio = torch.log(n.clamp(min=1).double() / exact) / math.log(max_distance / exact)
    large = (exact + (log_ratio * (half - exact)).long()).clamp(max=half - 1)
    return (bucket + torch.where(n < exact, n, large)).to(device)


def deberta_bucket(relative, num_buckets, max_distance):
    """DeBERTa v2's log bucket of relative = i - j, clipped first to +-(K - 1), K = max_distance: itself up to
    N/2 in absolute value, beyond sign * (N/2 + ceil((N/2 - 1) log(|d| / (N/2)) / log((K - 1) / (N/2))))
    (computed in float64 on the CPU)."""
    device = relative.device
    half = num_buckets // 2
    clipped = relative.cpu().clamp(1 - max_distance, max_distance - 1)
    distance = clipped.abs()
    log_ratio = torch.log(distance.clamp(min=half).double() / half) / math.log((max_distance - 1) / half)
    far = (torch.ceil(log_ratio * (half - 1)) + half).long()
    return torch.where(distance <= half, clipped, clipped.sign() * far).to(device)


def deberta_delta(seq_len, config):
    """(T, T) delta(i, j) of query i and key j (DeBERTa Eq. 3), on the CPU."""
    positions = torch.arange(seq_len)
    relative = positions[:, None] - positions[None, :]
    span = config.deberta_buckets or config.deberta_max_distance
    if config.deberta_buckets:
        relative = deberta_bucket(relative, config.deberta_buckets, config.deberta_max_distance)
    return (relative + span).clamp(0, 2 * span - 1)


def alibi_slopes(num_heads):
    """ALiBi's slopes 2^(-8h/H); for H not a power of two, those of the power n below and every other
    slope of 2n heads."""
    def geometric(heads):
        return [2.0 ** (-8.0 * h / heads) for h in range(1, heads + 1)]

    if num_heads & (num_heads - 1) == 0:
        return torch.tensor(geometric(num_heads), dtype=torch.float64)
    below = 2 ** math.floor(math.log2(num_heads))
    slopes = geometric(below) + geometric(2 * below)[0::2][: num_heads - below]
    return torch.tensor(slopes, dtype=torch.float64)


def rotate(x, cos, sin):
    """Pairs (2k, 2k+1) of x (..., T, d) rotated by the angles of cos, sin (T, d/2)."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1).flatten(-2)


class TupeUntiedPositions(nn.Module):
    """TUPE's table P, its LayerNorm and U^Q, U^K (Eq. 7), the two [CLS] vectors of the paper's reset."""

    def __init__(self, config, rows, cls_vectors):
        super().__init__()
        dim = config.hidden_size
        self.position_embeddings = nn.Embedding(rows, dim)
        self.LayerNorm = nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.query = nn.Linear(dim, dim, bias=config.untied_proj_bias)
        self.key = nn.Linear(dim, dim, bias=config.untied_proj_bias)
        self.cls_vectors = nn.Parameter(torch.zeros(2, dim)) if cls_vectors else None
        self.num_heads = config.num_attention_heads

    def project(self, vectors):
        """(p U^Q, p U^K) per head, (H, N, d_h), p = LayerNorm(vectors)."""
        p = self.LayerNorm(vectors)
        heads = lambda x: x.view(x.size(0), self.num_heads, -1).transpose(0, 1)  # noqa: E731
        return heads(self.query(p)), heads(self.key(p))


class TupeFire(nn.Module):
    """FIRE's MLP f (one hidden ReLU layer, an output per head), log c and the threshold L."""

    def __init__(self, config):
        super().__init__()
        self.hidden = nn.Linear(2 if config.fire_signed else 1, config.fire_hidden)
        self.output = nn.Linear(config.fire_hidden, config.num_attention_heads)
        self.log_c = nn.Parameter(torch.tensor(math.log(0.1)))
        self.threshold = nn.Parameter(torch.tensor(float(config.fire_threshold)))

    def forward(self, offsets, seq_len, config):
        """(H, 2T-1) bias of the offsets j - i (2T-1,)."""
        c = self.log_c.exp()
        if config.fire_normaliser == "largest-distance":
            normaliser = torch.log1p(c * self.threshold.clamp(min=seq_len - 1)) + 1e-6
        else:
            normaliser = torch.log1p(c * self.threshold.clamp(min=seq_len))
        features = (torch.log1p(c * offsets.abs().to(c.dtype)) / normaliser)[:, None]
        if config.fire_signed:
            features = torch.cat([features, offsets.sign().to(c.dtype)[:, None]], -1)
        return self.output(torch.relu(self.hidden(features))).t()


class TupeEnhancedMaskDecoder(nn.Module):
    """DeBERTa's Enhanced Mask Decoder (§3.2): its learned absolute table P_abs and the passes."""

    def __init__(self, config):
        super().__init__()
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.passes = config.deberta_emd_layers

    def forward(self, layer, hidden, term, mask):
        """Q_n (B, T, C): ``layer`` applied ``passes`` times, queries from Q_0 = hidden + P_abs, keys and
        values from ``hidden`` (B, T, C)."""
        seq_len = hidden.size(1)
        rows = self.position_embeddings.num_embeddings
        if seq_len > rows:
            raise ValueError(f"input of {seq_len} tokens is longer than the {rows} learned positions of the "
                             "Enhanced Mask Decoder")
        query = hidden + self.position_embeddings.weight[:seq_len]
        for _ in range(self.passes):
            query, _ = layer(hidden, term, mask, query=query)
        return query


class TupePositionalTerm(nn.Module):
    """The position encodings that act in attention; :meth:`forward` gives each layer what it adds."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        heads, head_dim = config.num_attention_heads, config.hidden_size // config.num_attention_heads
        self.head_dim = head_dim
        self.release = config.cls_reset == "release"
        self.untied = None
        if config.untied_pos != "none":
            rows = config.max_position_embeddings + (1 if self.release else 0)
            paper_reset = config.untied_pos == "tupe" and config.cls_reset == "paper"
            self.untied = TupeUntiedPositions(config, rows, paper_reset)
        if config.rel_pos == "t5":
            self.relative_bias = nn.Embedding(config.rel_pos_buckets + (1 if self.release else 0), heads)
        if config.rel_pos == "alibi" and config.alibi_learned_slopes:
            self.alibi_log_slopes = nn.Parameter(torch.zeros(2 if config.alibi_asymmetric else 1, heads))
        if config.rel_pos.startswith("kerple-"):
            raw = "" if config.kerple_param == "clamped" else "raw_"
            for name in ("r1", "r2"):
                self.register_parameter(f"kerple_{raw}{name}", nn.Parameter(torch.ones(heads)))
        if config.rel_pos == "sandwich":
            first = 1 if config.sandwich_frequencies == "one-based" else 0
            self.register_buffer("sandwich_frequencies",
                                 initial_frequencies(config.sandwich_dim, first=first))
        if config.rel_pos == "fire":
            self.fire = TupeFire(config)
        if config.rel_pos == "deberta":
            span = config.deberta_buckets or config.deberta_max_distance
            self.deberta_table = nn.Parameter(torch.zeros(2 * span, config.hidden_size))
            self.deberta_table_norm = (nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
                                       if config.deberta_table_norm else None)
        if config.cls_reset == "paper" and config.untied_pos == "none":
            self.cls_thetas = nn.Parameter(torch.zeros(heads, 2))
        if config.rotary != "none":
            self._frequencies("rotary_frequencies", head_dim, config.rotary == "learnable",
                              config.rotary_base)
        if config.rel_pos.startswith("shaw-"):
            table = config.rel_pos[len("shaw-"):]
            if table == "learned":
                self.shaw_table = nn.Parameter(torch.zeros(2 * config.shaw_max_distance + 1, head_dim))
            else:
                self._frequencies("shaw_frequencies", head_dim, table == "learnable-sinusoidal")

    def _frequencies(self, name, dim, learnable, base=10000.0):
        if learnable:
            self.register_parameter(name, nn.Parameter(initial_frequencies(dim, base)))
        else:
            self.register_buffer(name, initial_frequencies(dim, base))

    def forward(self, seq_len, dtype):
        """dict: ``bias`` (H, T, T) content-free logits, ``q_shift``/``k_shift`` (H, T, d_h), ``cos``/``sin``
        (T, d_h/2), ``shaw`` (2K+1, d_h) with ``shaw_index`` (T, T), DeBERTa's ``deberta`` rows of P this
        length reaches (R, C) with ``deberta_index`` (T, T) delta(i, j) into them and ``deberta_p2c_index``
        the row of p2c; each None where not used."""
        config = self.config
        term = dict(bias=None, q_shift=None, k_shift=None, cos=None, sin=None, shaw=None, shaw_index=None,
                    deberta=None, deberta_index=None, deberta_p2c_index=None)
        positions = torch.arange(seq_len, device=self._device())
        scale = attention_scale(config)
        bias = self._offset_bias(positions)
        if self.untied is not None and config.untied_pos == "four-term":
            term["q_shift"], term["k_shift"] = self.untied.project(self._untied_rows(seq_len))
        elif self.untied is not None:
            q, k = self.untied.project(self._untied_rows(seq_len))
            untied = torch.matmul(q * scale, k.transpose(1, 2))
            thetas = self._untied_thetas()
            if thetas is not None:
                untied = reset_cls(untied, thetas[:, 0] * scale, thetas[:, 1] * scale)
                if bias is not None and not self.release:
                    bias = reset_cls(bias, torch.zeros_like(thetas[:, 0]), torch.zeros_like(thetas[:, 1]))
            bias = untied if bias is None else bias + untied
        elif config.cls_reset == "paper":
            bias = reset_cls(bias, self.cls_thetas[:, 0], self.cls_thetas[:, 1])
        term["bias"] = None if bias is None else bias.to(dtype)
        if config.rotary != "none":
            angles = self._rotary_angles(positions)
            term["cos"], term["sin"] = angles.cos().to(dtype), angles.sin().to(dtype)
        if config.rel_pos.startswith("shaw-"):
            distance = config.shaw_max_distance
            if hasattr(self, "shaw_table"):
                term["shaw"] = self.shaw_table.to(dtype)
            else:
                term["shaw"] = sinusoids(torch.arange(-distance, distance + 1, device=positions.device),
                                         self.shaw_frequencies).to(dtype)
            relative = positions[None, :] - positions[:, None]
            term["shaw_index"] = relative.clamp(-distance, distance) + distance
        if config.rel_pos == "deberta":
            index = deberta_delta(seq_len, config)
            first, last = int(index.min()), int(index.max())
            table = self.deberta_table[first:last + 1]
            if self.deberta_table_norm is not None:
                table = self.deberta_table_norm(table)
            term["deberta"] = table.to(dtype)
            term["deberta_index"] = (index - first).to(positions.device)
            released = config.deberta_p2c == "released"
            term["deberta_p2c_index"] = term["deberta_index"] if released else term["deberta_index"].t()
        return term

    def _device(self):
        return next(self.parameters(), next(self.buffers(), torch.empty(0))).device

    def _untied_rows(self, seq_len):
        if seq_len > self.config.max_position_embeddings:
            raise ValueError(f"input of {seq_len} tokens is longer than the "
                             f"{self.config.max_position_embeddings} learned positions of the untied table")
        weight = self.untied.position_embeddings.weight
        return weight[1:seq_len + 1] if self.release else weight[:seq_len]

    def _untied_thetas(self):
        """(H, 2) unscaled theta_1, theta_2 of the untied term's [CLS] reset, or None."""
        if self.release:
            q, k = self.untied.project(self.untied.position_embeddings.weight[:2])
        elif self.untied.cls_vectors is not None:
            q, k = self.untied.project(self.untied.cls_vectors)
        else:
            return None
        return (q * k).sum(-1)

    def _offset_bias(self, positions):
        """The T5, ALiBi, KERPLE, Sandwich or FIRE bias (H, T, T) of j - i, or None."""
        config = self.config
        relative = positions[None, :] - positions[:, None]
        if config.rel_pos == "t5":
            buckets = t5_bucket(relative, config.rel_pos_buckets, config.rel_pos_max_distance)
            if self.release:
                buckets[:, 0] = config.rel_pos_buckets
                buckets[0, :] = config.rel_pos_buckets // 2
            return self.relative_bias(buckets).permute(2, 0, 1)
        if config.rel_pos == "alibi":
            if hasattr(self, "alibi_log_slopes"):
                slopes = self.alibi_log_slopes.exp()
            else:
                paper = alibi_slopes(config.num_attention_heads).float().to(positions.device)
                slopes = torch.stack([paper, paper.flip(0)]) if config.alibi_asymmetric else paper[None]
            per_side = torch.where(relative[None] > 0, slopes[-1][:, None, None], slopes[0][:, None, None])
            return -per_side * relative.abs().to(slopes.dtype)[None]
        seq_len = positions.size(0)
        offsets = torch.arange(1 - seq_len, seq_len, device=positions.device)
        if config.rel_pos.startswith("kerple-"):
            per_offset = self._kerple(offsets)
        elif config.rel_pos == "sandwich":
            per_offset = self._sandwich(offsets)
        elif config.rel_pos == "fire":
            per_offset = self.fire(offsets, seq_len, config)
        else:
            return None
        return per_offset[:, relative + seq_len - 1]

    def _kerple(self, offsets):
        """(H, 2T-1) KERPLE bias of the offsets; the clamped form clamps r1, r2 in place first (on ``.data``,
        as the released code: the parameters' version is kept for the backward)."""
        power = self.config.rel_pos == "kerple-power"
        if self.config.kerple_param == "clamped":
            self.kerple_r1.data.clamp_(min=0.01)
            self.kerple_r2.data.clamp_(0.01, 2.0 if power else None)
            r1, r2 = self.kerple_r1, self.kerple_r2
        else:
            r1 = F.softplus(self.kerple_raw_r1)
            r2 = 2 * torch.sigmoid(self.kerple_raw_r2) if power else F.softplus(self.kerple_raw_r2)
        r1, r2 = r1[:, None], r2[:, None]
        distance = offsets.abs().to(r1.dtype)[None]
        if power:
            # 0^r2 = 0, the power taken of 1 there so that its r2-derivative is 0, not nan
            return -r1 * torch.where(distance > 0, distance.clamp(min=1) ** r2, torch.zeros_like(distance))
        return -r1 * torch.log1p(r2 * distance)

    def _sandwich(self, offsets):
        """(H, 2T-1) Sandwich bias of the offsets, in float32."""
        config = self.config
        angles = offsets.float()[:, None] * self.sandwich_frequencies.float()
        inner = angles.cos().sum(-1) - config.sandwich_dim / 2
        heads = config.num_attention_heads
        compression = 8 * torch.arange(1, heads + 1, device=offsets.device) / heads
        return config.sandwich_scale * inner / compression[:, None]

    def _rotary_angles(self, positions):
        config = self.config
        if config.rotary_scaling == "linear":
            scaled = positions.float() / config.rotary_scaling_factor
            return scaled[:, None] * self.rotary_frequencies.float()
        if config.rotary_scaling == "ntk":
            dim = self.head_dim
            base = config.rotary_base * config.rotary_scaling_factor ** (dim / (dim - 2))
            return positions.float()[:, None] * initial_frequencies(dim, base).to(positions.device)
        return positions.float()[:, None] * self.rotary_frequencies.float()


def reset_cls(bias, theta_1, theta_2):
    """TUPE Eq. 9: row 0 of bias (H, T, T) set to theta_1 (H,), column 0 of the other rows to theta_2."""
    first = torch.arange(bias.size(-1), device=bias.device) == 0
    theta_1, theta_2 = theta_1[:, None, None].to(bias.dtype), theta_2[:, None, None].to(bias.dtype)
    return torch.where(first[:, None], theta_1, torch.where(first[None, :], theta_2, bias))


def attention_scale(config):
    """1/sqrt(d_h); 1/sqrt(2 d_h) with TUPE's untied term (Eq. 7); 1/sqrt(4 d_h) for BERT-A^d (§4.3);
    1/sqrt(3 d_h) for DeBERTa's three terms (Eq. 4)."""
    terms = {"tupe": 2, "four-term": 4}.get(config.untied_pos, 3 if config.rel_pos == "deberta" else 1)
    return 1.0 / math.sqrt(terms * (config.hidden_size // config.num_attention_heads))


class TupeSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scale = attention_scale(config)
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.output = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = config.attention_probs_dropout_prob
        if config.rel_pos == "deberta" and not config.deberta_share_att_key:
            biases = config.deberta_rel_proj_bias
            self.relative_query = nn.Linear(config.hidden_size, config.hidden_size,
                                            bias=biases in ("query", "both"))
            self.relative_key = nn.Linear(config.hidden_size, config.hidden_size, bias=biases == "both")

    def forward(self, x, term, mask, output_attentions=False, query=None):
        """x (B, T, C); term: :meth:`TupePositionalTerm.forward`; mask (B, H or 1, T, T) additive logits with
        padded keys at the dtype's minimum; ``query`` (B, T, C): the states of the queries, x then gives the
        keys and values only (the Enhanced Mask Decoder). Returns the output and the probabilities (or
        None)."""
        batch, seq_len, dim = x.shape
        if query is None:
            qkv = self.qkv(x)
        else:
            weight, bias = self.qkv.weight, self.qkv.bias
            qkv = torch.cat([F.linear(query, weight[:dim], bias[:dim]),
                             F.linear(x, weight[dim:], bias[dim:])], -1)
        q, k, v = qkv.view(batch, seq_len, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if term["cos"] is not None:
            q, k = rotate(q, term["cos"], term["sin"]), rotate(k, term["cos"], term["sin"])
        if term["q_shift"] is not None:
            q, k = q + term["q_shift"], k + term["k_shift"]
        dropout = self.dropout if self.training else 0.0
        shaw = term["shaw"]
        if shaw is not None:
            mask = mask + gather_distances(torch.matmul(q * self.scale, shaw.t()), term["shaw_index"])
        if term["deberta"] is not None:
            mask = mask + self._disentangled(q, k, term)
        eager = output_attentions or self.config._attn_implementation != "sdpa" or (
            shaw is not None and not self.config.shaw_keys_only)
        if eager:
            logits = torch.matmul(q * self.scale, k.transpose(-1, -2)) + mask
            probs = F.dropout(logits.softmax(-1), dropout, self.training)
            out = torch.matmul(probs, v)
            if shaw is not None and not self.config.shaw_keys_only:
                out = out + sum_distances(probs, term["shaw_index"], shaw)
        else:
            probs = None
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=self.scale)
        out = out.transpose(1, 2).reshape(batch, seq_len, dim)
        return self.output(out), probs if output_attentions else None

    def _disentangled(self, q, k, term):
        """DeBERTa's scale * (q_i . K^r_delta(i,j) + k_j . Q^r of the p2c row), (B, H, T, T): q and k against
        the rows of P this length reaches, gathered."""
        table = term["deberta"]
        dim = table.size(-1)
        if hasattr(self, "relative_query"):
            query_rows, key_rows = self.relative_query(table), self.relative_key(table)
        else:
            weight, bias = self.qkv.weight, self.qkv.bias
            query_rows = F.linear(table, weight[:dim], bias[:dim])
            key_rows = F.linear(table, weight[dim:2 * dim], bias[dim:2 * dim])
        heads = lambda x: x.view(x.size(0), self.num_heads, self.head_dim).transpose(0, 1)  # noqa: E731
        content_to_position = gather_distances(torch.matmul(q * self.scale, heads(key_rows).transpose(1, 2)),
                                               term["deberta_index"])
        # row j of key j against every row of Q^r, gathered at the p2c row of (i, j), transposed to (i, j)
        key_scores = torch.matmul(k * self.scale, heads(query_rows).transpose(1, 2))
        position_to_content = gather_distances(key_scores, term["deberta_p2c_index"].t()).transpose(-1, -2)
        return content_to_position + position_to_content


def gather_distances(per_distance, index):
    """(B, H, T, 2K+1) scores of every distance -> (B, H, T, T): entry (i, j) from column index[i, j]."""
    return per_distance.gather(-1, index.expand(*per_distance.shape[:2], -1, -1))


def sum_distances(probs, index, table):
    """sum_j probs_ij a_{index(i,j)}: the probabilities summed per distance, times the table."""
    per_distance = probs.new_zeros(*probs.shape[:-1], table.size(0))
    per_distance.scatter_add_(-1, index.expand(*probs.shape[:2], -1, -1), probs)
    return torch.matmul(per_distance, table)


class TupeLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.pre_layer_norm = config.pre_layer_norm
        self.attention = TupeSelfAttention(config)
        self.attention_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.output_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.activation_dropout = nn.Dropout(config.activation_dropout)

    def _residual(self, x, layer_norm, block):
        y = block(layer_norm(x) if self.pre_layer_norm else x)
        x = x + self.dropout(y)
        return x if self.pre_layer_norm else layer_norm(x)

    def _feed_forward(self, h):
        return self.output(self.activation_dropout(self.activation(self.intermediate(h))))

    def forward(self, x, term, mask, output_attentions=False, query=None):
        """With ``query`` (B, T, C) the attention reads its queries from it and its keys and values from x,
        and the residual stream is the query's (the Enhanced Mask Decoder)."""
        probs = []
        keys = None if query is None else self.attention_layer_norm(x) if self.pre_layer_norm else x

        def attend(h):
            out, p = (self.attention(h, term, mask, output_attentions) if keys is None
                      else self.attention(keys, term, mask, output_attentions, query=h))
            probs.append(p)
            return out

        x = self._residual(x if query is None else query, self.attention_layer_norm, attend)
        x = self._residual(x, self.output_layer_norm, self._feed_forward)
        return x, probs[0]


class TupeEmbeddings(nn.Module):
    """Word embeddings, the absolute position encoding added to them, LayerNorm, dropout."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        dim = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, dim, padding_idx=config.pad_token_id)
        if config.abs_pos == "learned":
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, dim)
        elif config.abs_pos == "learnable-sinusoidal":
            self.position_frequencies = nn.Parameter(initial_frequencies(dim))
        elif config.abs_pos == "sinusoidal":
            self.register_buffer("position_frequencies", initial_frequencies(dim))
        self.LayerNorm = nn.LayerNorm(dim, eps=config.layer_norm_eps) if config.embedding_layer_norm else None
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids=None, inputs_embeds=None):
        x = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        seq_len = x.size(1)
        if self.config.abs_pos == "learned":
            if seq_len > self.config.max_position_embeddings:
                raise ValueError(f"input of {seq_len} tokens is longer than the "
                                 f"{self.config.max_position_embeddings} learned absolute positions")
            x = x + self.position_embeddings.weight[:seq_len]
        elif self.config.abs_pos != "none":
            positions = torch.arange(seq_len, device=x.device)
            x = x + sinusoids(positions, self.position_frequencies).to(x.dtype)
        if self.LayerNorm is not None:
            x = self.LayerNorm(x)
        return self.dropout(x)


# The weights of the task heads: a model class without one leaves the file's (the encoder alone leaves the
# masked-LM head's), and one the file lacks is new (a classifier to fine-tune).
HEAD_WEIGHTS = ("lm_head.", "classifier.", "qa_outputs.")


class TupePreTrainedModel(PreTrainedModel):
    config_class = TupeConfig
    config: TupeConfig
    base_model_prefix = "tupe"
    _supports_sdpa = True
    _supports_attention_backend = False

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' loader; encoder weights of the file that the config does not describe, or that it
        describes and the file lacks, are a ValueError naming them (transformers would only report them,
        as weights that "can be ignored" or new ones, and compute other outputs)."""
        wanted = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        for keys, problem in ((info["unexpected_keys"], "holds weights its config.json does not describe"),
                              (info["missing_keys"], "lacks weights its config.json describes")):
            encoder = sorted(key for key in keys if not key.startswith(HEAD_WEIGHTS))
            if encoder:
                shown = ", ".join(encoder[:3]) + (f" and {len(encoder) - 3} more" if len(encoder) > 3 else "")
                raise ValueError(f"the export {problem} ({shown}): config.json was edited or is another "
                                 "export's; export the checkpoint again with tupe-export-hf")
        return (model, info) if wanted else model


class TupeModel(TupePreTrainedModel):
    """The encoder: features (B, T, C) of the last layer (after the final LayerNorm when pre-LN); with
    ``mask_decoder`` and DeBERTa's Enhanced Mask Decoder, its query stream instead (what the masked-LM head
    reads)."""

    def __init__(self, config):
        super().__init__(config)
        self.embeddings = TupeEmbeddings(config)
        self.position = TupePositionalTerm(config)
        self.layer = nn.ModuleList(TupeLayer(config) for _ in range(config.num_hidden_layers))
        self.final_layer_norm = (nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
                                 if config.pre_layer_norm else None)
        self.enhanced_mask_decoder = TupeEnhancedMaskDecoder(config) if config.deberta_emd else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, output_attentions=None,
                output_hidden_states=None, return_dict=None, mask_decoder=False, **kwargs):
        output_attentions = (output_attentions if output_attentions is not None
                             else self.config.output_attentions)
        output_hidden_states = (output_hidden_states if output_hidden_states is not None
                                else self.config.output_hidden_states)
        x = self.embeddings(input_ids, inputs_embeds)
        batch, seq_len, _ = x.shape
        if attention_mask is None:
            attention_mask = torch.ones(batch, seq_len, dtype=torch.long, device=x.device)
        padding = attention_mask.eq(0)
        x = x * (1 - padding.unsqueeze(-1).to(x.dtype))
        term = self.position(seq_len, x.dtype)
        bias = term["bias"] if term["bias"] is not None else x.new_zeros(1, seq_len, seq_len)
        mask = bias[None].masked_fill(padding[:, None, None, :], torch.finfo(x.dtype).min)
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        decoder = self.enhanced_mask_decoder if mask_decoder else None
        for layer in self.layer:
            before_last = x
            x, probs = layer(x, term, mask, output_attentions)
            if output_hidden_states:
                hidden_states.append(x)
            if output_attentions:
                attentions.append(probs)
        if self.final_layer_norm is not None:
            x = self.final_layer_norm(x)
            if output_hidden_states:
                hidden_states[-1] = x
        if decoder is not None:
            x = decoder(self.layer[-1], before_last, term, mask)
            x = x if self.final_layer_norm is None else self.final_layer_norm(x)
        return BaseModelOutput(last_hidden_state=x,
                               hidden_states=tuple(hidden_states) if output_hidden_states else None,
                               attentions=tuple(attentions) if output_attentions else None)


class TupeLMHead(nn.Module):
    """RoBERTa's masked-LM head: dense, activation, LayerNorm, the word embeddings (tied) plus a bias."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, features):
        return self.decoder(self.LayerNorm(self.activation(self.dense(features)))) + self.bias


class TupeForMaskedLM(TupePreTrainedModel):
    _tied_weights_keys = {"lm_head.decoder.weight": "tupe.embeddings.word_embeddings.weight"}

    def __init__(self, config):
        super().__init__(config)
        self.tupe = TupeModel(config)
        self.lm_head = TupeLMHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, value):
        self.lm_head.decoder = value

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, labels=None, **kwargs):
        outputs = self.tupe(input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                            mask_decoder=True, **kwargs)
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.view(-1, self.config.vocab_size), labels.view(-1))
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states,
                              attentions=outputs.attentions)


class TupeClassificationHead(nn.Module):
    """RoBERTa's sentence head on the <s> features: dropout, dense, activation, dropout, projection."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACTIVATIONS[config.pooler_activation]
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, features):
        x = self.dropout(features[:, 0])
        return self.out_proj(self.dropout(self.activation(self.dense(x))))


class TupeForSequenceClassification(TupePreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.tupe = TupeModel(config)
        self.classifier = TupeClassificationHead(config)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, labels=None, **kwargs):
        outputs = self.tupe(input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs)
        logits = self.classifier(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            if self.num_labels == 1 or self.config.problem_type == "regression":
                loss = F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype).view(-1))
            else:
                loss = F.cross_entropy(logits.view(-1, self.num_labels), labels.view(-1))
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states,
                                        attentions=outputs.attentions)


class TupeForQuestionAnswering(TupePreTrainedModel):
    """BERT's span head: one linear map of every token's features to start and end logits."""

    def __init__(self, config):
        super().__init__(config)
        self.tupe = TupeModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, start_positions=None,
                end_positions=None, **kwargs):
        outputs = self.tupe(input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs)
        start_logits, end_logits = self.qa_outputs(outputs.last_hidden_state).unbind(-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            ignored = start_logits.size(1)
            loss = (F.cross_entropy(start_logits, start_positions.clamp(0, ignored), ignore_index=ignored)
                    + F.cross_entropy(end_logits, end_positions.clamp(0, ignored), ignore_index=ignored)) / 2
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits, end_logits=end_logits,
                                            hidden_states=outputs.hidden_states,
                                            attentions=outputs.attentions)
