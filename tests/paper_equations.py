"""Plain, step-by-step twin of the plugin's encoder, written from the papers' equations.

Nothing here calls the plugin's attention, positional-term, bucket or sinusoid code: it reads the
model's parameters and loops over heads, computing each logit term of TUPE Eq. 3-11 (and the
§4.3 BERT-A^d ablation) as written, with the [CLS] reset applied entry by entry, the sinusoids of
Wang et al. 2021 Table 1 element by element and the Shaw vectors of Wang et al. 2021 Eq. 4 pair by pair,
the ALiBi, KERPLE, Sandwich and FIRE biases pair by pair, RoPE's rotation as 2x2 blocks (its angles
scaled for longer inputs as --rotary-scaling says) and DeBERTa's content-to-position and position-to-content
terms (He et al. 2021 Eq. 3-4) pair by pair, with the passes of its Enhanced Mask Decoder (§3.2) before the
masked-LM head, Transformer-XL's relative terms (Dai et al. 2019 §3.3, bidirectional as XLNet) pair by
pair, CoPE's contextual positions (Golovneva et al. 2024, counted in both directions) pair by pair, and DAPE's
MLP over the heads' logits and bias (Zheng et al. 2024) pair by pair.
"""

import math

import torch
import torch.nn.functional as F


def t5_bucket(distance_key_minus_query, num_buckets=32, max_distance=128):
    """T5's bidirectional bucket of one integer offset, in plain Python."""
    half = num_buckets // 2
    n = -distance_key_minus_query
    bucket = half if n < 0 else 0
    n = abs(n)
    exact = half // 2
    if n < exact:
        return bucket + n
    large = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (half - exact))
    return bucket + min(large, half - 1)


def exact_t5_bucket(rel):
    """The default T5 bucket (32 buckets, max distance 128) of rel = key - query, in integers.

    Per direction 16 buckets: distances 0-7 exact, then 8 + floor(2 log2(n / 8)) (log-spaced up to 128,
    clipped at 15), i.e. the largest k with 64 * 2^k <= n^2: no logarithm, so the boundaries at 16, 32
    and 64 are exact. Keys after the query add 16.
    """
    n = abs(rel)
    if n < 8:
        bucket = n
    else:
        k = 0
        while 64 * 2 ** (k + 1) <= n * n:
            k += 1
        bucket = min(15, 8 + k)
    return bucket + (16 if rel > 0 else 0)


def sinusoid(position, frequencies):
    """[.., sin(w_i x), cos(w_i x), ..] for one integer position (Wang et al. 2021 Table 1)."""
    values = []
    for w in frequencies:
        values += [torch.sin(w * position), torch.cos(w * position)]
    return torch.stack(values)


def absolute_position(encoder, t):
    module = encoder.embed_positions
    if hasattr(module, "sinusoid"):
        return sinusoid(t, module.sinusoid.frequencies)
    return module.weight[t]


def shaw_vector(encoder, distance):
    """a_{clip(distance, -K, K)} of Wang et al. 2021 Eq. 4."""
    shaw = encoder.positional_term.shaw
    clipped = max(-shaw.max_distance, min(shaw.max_distance, distance))
    if hasattr(shaw, "sinusoid"):
        return sinusoid(clipped, shaw.sinusoid.frequencies)
    return shaw.weight[clipped + shaw.max_distance]


def alibi_slope(head, num_heads):
    """m_h of ALiBi (Press et al. 2022) for head index ``head`` (0-based), the paper's rule."""
    def geometric(heads):
        return [2 ** (-8 * h / heads) for h in range(1, heads + 1)]

    if math.log2(num_heads).is_integer():
        return geometric(num_heads)[head]
    below = 2 ** int(math.log2(num_heads))
    return (geometric(below) + geometric(2 * below)[0::2])[head]


def alibi_bias(encoder, head, offset):
    """ALiBi's -m |j - i| for one head and offset j - i. With --alibi-asymmetric, keys after the query
    (j > i) take the slope of head H-1-h (fixed) or the second learned row; learned slopes are exp(a)."""
    config = encoder.config
    after = config.alibi_asymmetric and offset > 0
    if config.alibi_learned_slopes:
        slope = torch.exp(encoder.positional_term.relative_bias.log_slopes[int(after), head])
    else:
        slope = torch.tensor(alibi_slope(config.num_heads - 1 - head if after else head, config.num_heads))
    return -slope * abs(offset)


def kerple_bias(module, head, distance, power):
    """KERPLE (Chi et al. 2022) for one head and one distance |j - i|: -r1 log(1 + r2 d) or -r1 d^r2. As
    released (--kerple-param clamped): r1, r2 the parameters, r1 >= 0.01, r2 in [0.01, 2] (power) or
    >= 0.01 (log); --kerple-param softplus: r1 = softplus(a1), r2 = softplus(a2) (log) or 2 sigmoid(a2)
    (power)."""
    if module.clamped:
        r1 = torch.clamp(module.r1[head], min=0.01)
        r2 = torch.clamp(module.r2[head], 0.01, 2.0 if power else None)
    else:
        r1 = F.softplus(module.raw_r1[head])
        r2 = 2 * torch.sigmoid(module.raw_r2[head]) if power else F.softplus(module.raw_r2[head])
    if not power:
        return -r1 * torch.log(1 + r2 * distance)
    if distance == 0:
        return r1 * 0
    return -r1 * distance ** r2


def sandwich_bias(config, head, i, j):
    """Sandwich (Chi et al. 2023) for the pair (i, j) and head h (0-based) of H: S (p_i . p_j - d'/2) /
    (8 (h + 1) / H), the paper's per-head compression (its Appendix E), with p_t the d'-dimensional sinusoid
    [.., sin(w_k t), cos(w_k t), ..], w_k = 10000^(-2k/d'), k = 1..d'/2 (the paper's sum; k = 0..d'/2-1
    with --sandwich-frequencies zero-based), computed in float64."""
    dim = config.sandwich_dim
    first = 1 if config.sandwich_frequencies == "one-based" else 0
    frequencies = torch.tensor([10000.0 ** (-2 * k / dim) for k in range(first, dim // 2 + first)],
                               dtype=torch.float64)
    p_i = sinusoid(torch.tensor(float(i), dtype=torch.float64), frequencies)
    p_j = sinusoid(torch.tensor(float(j), dtype=torch.float64), frequencies)
    compression = 8 * (head + 1) / config.num_heads
    return float(config.sandwich_scale * (p_i @ p_j - dim / 2) / compression)


def fire_bias(module, head, i, j, seq_len, signed):
    """FIRE (Li et al. 2023), bidirectional, for one head and pair: f(psi(|j - i|) / (psi(max(L, T - 1))
    + 1e-6)), the paper's normaliser of its last causal row T - 1 with the appendix code's eps (with
    --fire-normaliser length: psi(max(L, T)), no eps), psi(x) = log(c x + 1), c = exp(a),
    f(x) = W2 relu(W1 x + b1) + b2; signed: x = (that, sign(j - i))."""
    c = torch.exp(module.log_c)
    if module.largest_distance:
        longest = torch.maximum(module.threshold, torch.tensor(float(seq_len - 1)))
        x = torch.log(c * abs(j - i) + 1) / (torch.log(c * longest + 1) + 1e-6)
    else:
        longest = torch.maximum(module.threshold, torch.tensor(float(seq_len)))
        x = torch.log(c * abs(j - i) + 1) / torch.log(c * longest + 1)
    if signed:
        x = torch.stack([x, torch.tensor(float((j > i) - (j < i)))])
    first, second = module.mlp[0], module.mlp[2]
    hidden = torch.relu(first.weight @ x.reshape(-1) + first.bias)
    return second.weight[head] @ hidden + second.bias[head]


def deberta_delta(i, j, config):
    """delta(i, j) of DeBERTa (He et al. 2021 Eq. 3): 0 for i - j <= -k, 2k - 1 for i - j >= k, i - j + k
    otherwise. With v2's log buckets (N = --deberta-buckets, K = --deberta-max-distance) i - j, clipped to
    +-(K - 1), is first replaced beyond N/2 by sign * (N/2 + ceil((N/2 - 1) log(|i - j| / (N/2)) /
    log((K - 1) / (N/2)))), and k = N."""
    d, k = i - j, config.deberta_max_distance
    if config.deberta_buckets:
        half, reach = config.deberta_buckets // 2, config.deberta_max_distance
        d = max(1 - reach, min(reach - 1, d))
        if abs(d) > half:
            steps = math.ceil(math.log(abs(d) / half) / math.log((reach - 1) / half) * (half - 1))
            d = (half + steps) * (1 if d > 0 else -1)
        k = config.deberta_buckets
    if d <= -k:
        return 0
    if d >= k:
        return 2 * k - 1
    return d + k


def deberta_position_terms(encoder, layer, q, k, head):
    """(B, T, T) content-to-position q_i . K^r_delta(i,j) plus position-to-content k_j . Q^r_delta(i,j) of
    one head, as the authors' released code (k_j . Q^r_delta(j,i), Eq. 4 as printed, with --deberta-p2c
    paper); Q^r = P W^{q,r} (+ b^{q,r} with --deberta-rel-proj-bias query or both), K^r = P W^{k,r}
    (+ b^{k,r} with both); with --deberta-share-att-key the layer's content projections W^q, W^k and their
    biases project P instead; with --deberta-table-norm P is layer-normalised first."""
    config, attn = encoder.config, layer.self_attn
    disentangled = encoder.positional_term.disentangled
    table = disentangled.weight
    if config.deberta_table_norm:
        norm = disentangled.norm
        mean = table.mean(-1, keepdim=True)
        variance = ((table - mean) ** 2).mean(-1, keepdim=True)
        table = (table - mean) / torch.sqrt(variance + norm.eps) * norm.weight + norm.bias
    rows = slice(head * attn.head_dim, (head + 1) * attn.head_dim)
    if config.deberta_share_att_key:
        w, b, dim = attn.in_proj.weight, attn.in_proj.bias, config.embed_dim
        query_rows = table @ w[:dim][rows].t() + b[:dim][rows]
        key_rows = table @ w[dim: 2 * dim][rows].t() + b[dim: 2 * dim][rows]
    else:
        projections = attn.relative_projections
        query_rows = table @ projections.query.weight[rows].t()
        key_rows = table @ projections.key.weight[rows].t()
        if config.deberta_rel_proj_bias in ("query", "both"):
            query_rows = query_rows + projections.query.bias[rows]
        if config.deberta_rel_proj_bias == "both":
            key_rows = key_rows + projections.key.bias[rows]
    seq_len = q.size(1)

    def p2c_row(i, j):
        return (deberta_delta(i, j, config) if config.deberta_p2c == "released"
                else deberta_delta(j, i, config))

    return torch.stack([
        torch.stack([q[:, i] @ key_rows[deberta_delta(i, j, config)] + k[:, j] @ query_rows[p2c_row(i, j)]
                     for j in range(seq_len)], -1)
        for i in range(seq_len)
    ], 1)


def xl_sinusoid(distance, dim):
    """Transformer-XL's R_d: [sin(d w_0), .., sin(d w_(C/2-1)), cos(d w_0), .., cos(d w_(C/2-1))],
    w_k = 10000^(-2k/C), element by element."""
    frequencies = [10000 ** (-2 * k / dim) for k in range(dim // 2)]
    return torch.tensor([math.sin(distance * w) for w in frequencies]
                        + [math.cos(distance * w) for w in frequencies])


def xl_logits(encoder, layer, q, k, head):
    """(B, T, T) (q_i + u) . k_j + (q_i + v) . W_R R_(i-j) of one head, unscaled (Dai et al. 2019 §3.3): u, v
    the head's rows of the shared content and position biases, W_R the layer's projection, i - j clamped to
    [-K, K] with --xl-max-distance K > 0."""
    xl, attn = encoder.positional_term.transformer_xl, layer.self_attn
    u, v = xl.content_bias[head], xl.position_bias[head]
    rows = slice(head * attn.head_dim, (head + 1) * attn.head_dim)
    w_r = attn.relative_projections.key.weight[rows]
    reach, seq_len = encoder.config.xl_max_distance, q.size(1)
    content = (q + u) @ k.transpose(1, 2)
    position = torch.stack([torch.stack([
        (q[:, i] + v) @ (w_r @ xl_sinusoid(max(-reach, min(reach, i - j)) if reach else i - j, w_r.size(1)))
        for j in range(seq_len)], -1) for i in range(seq_len)], 1)
    return content + position


def cope_logits(layer, q, logits, padding_mask):
    """(B, T, T) CoPE's position logits of one head (Golovneva et al. 2024, Eq. 3-5, as released: divided by
    sqrt(d_h)), pair by pair: g_it = sigmoid(logits_it), 0 at padded keys; p_ij = the sum of g_it over t from
    j to i (j <= i) or from i to j (j > i), clipped to P; z_ij = w q_i . e[ceil p] + (1 - w) q_i . e[floor p],
    w = p - floor p, with e the layer's table of P + 1 rows."""
    table = layer.self_attn.layer_terms["cope"].table
    largest = table.size(0) - 1
    batch, seq_len, head_dim = q.shape
    gates = torch.sigmoid(logits)
    if padding_mask is not None:
        gates = gates * (~padding_mask)[:, None, :].float()
    rows = []
    for b in range(batch):
        pairs = []
        for i in range(seq_len):
            for j in range(seq_len):
                p = sum(gates[b, i, t] for t in range(min(i, j), max(i, j) + 1))
                p = torch.clamp(p, max=largest)
                below, above = int(math.floor(p.item())), int(math.ceil(p.item()))
                w = p - below
                pairs.append(w * (q[b, i] @ table[above]) + (1 - w) * (q[b, i] @ table[below]))
        rows.append(torch.stack(pairs).view(seq_len, seq_len))
    return torch.stack(rows) / math.sqrt(head_dim)


def rope_angles(config, frequencies, t):
    """RoPE's angles theta_k t of the pairs k at position t (Su et al. 2021), as --rotary-scaling scales
    them by F: linear = theta_k (t / F) (position interpolation, Chen et al. 2023); ntk = theta'_k t with
    theta'_k = base'^(-2k/d), base' = base F^(d/(d-2)) (NTK-aware, YaRN §3)."""
    factor = config.rotary_scaling_factor
    if config.rotary_scaling == "linear":
        return frequencies * (t / factor)
    if config.rotary_scaling == "ntk":
        d = 2 * len(frequencies)
        base = config.rotary_base * factor ** (d / (d - 2))
        return torch.tensor([base ** (-2 * k / d) for k in range(d // 2)]) * t
    return frequencies * t


def rotation(config, frequencies, t):
    """The block-diagonal matrix of the 2x2 rotations by the angles :func:`rope_angles` of position t, one
    block per pair (2k, 2k+1)."""
    angles = rope_angles(config, frequencies, t)
    cos, sin = torch.cos(angles), torch.sin(angles)
    blocks = [torch.stack([torch.stack([c, -s]), torch.stack([s, c])]) for c, s in zip(cos, sin)]
    return torch.block_diag(*blocks)


def rotated(x, config, frequencies, positions=None):
    """RoPE (Su et al. 2021): x (B, T, d), its token t of row b at position positions[b][t] (by default t),
    times the :func:`rotation` of that position."""
    positions = positions or [list(range(x.size(1)))] * x.size(0)
    return torch.stack([torch.stack([x[b, t] @ rotation(config, frequencies, position).t()
                                     for t, position in enumerate(row)]) for b, row in enumerate(positions)])


def layer_norm(x, module):
    return F.layer_norm(x, x.shape[-1:], module.weight, module.bias, module.eps)


def content_free_correlation(encoder, seq_len, head):
    """v_ij of TUPE §3.2 for one head, after reset_theta (Eq. 9), or None (BERT-A)."""
    term = encoder.positional_term
    head_dim = encoder.layers[0].self_attn.head_dim
    rows = slice(head * head_dim, (head + 1) * head_dim)
    v = torch.zeros(seq_len, seq_len)
    used = False
    untied = term.untied_position
    if untied is not None and encoder.config.untied:
        p = layer_norm(untied.embed_positions.weight[:seq_len], untied.layer_norm)
        pq = p @ untied.q_proj.weight[rows].t()
        pk = p @ untied.k_proj.weight[rows].t()
        v = v + (pq @ pk.t()) / math.sqrt(2 * head_dim)
        used = True
    if encoder.config.alibi:
        v = v + torch.stack([torch.stack([alibi_bias(encoder, head, j - i) for j in range(seq_len)])
                             for i in range(seq_len)])
        used = True
    if encoder.config.kerple:
        v = v + torch.stack([torch.stack([kerple_bias(term.relative_bias, head, abs(j - i),
                                                      encoder.config.kerple_power)
                                          for j in range(seq_len)]) for i in range(seq_len)])
        used = True
    if encoder.config.fire:
        v = v + torch.stack([torch.stack([fire_bias(term.relative_bias, head, i, j, seq_len,
                                                    encoder.config.fire_signed)
                                          for j in range(seq_len)]) for i in range(seq_len)])
        used = True
    if encoder.config.sandwich:
        v = v + torch.tensor([[sandwich_bias(encoder.config, head, i, j) for j in range(seq_len)]
                              for i in range(seq_len)])
        used = True
    if encoder.config.t5_bias:
        table = term.relative_bias.relative_attention_bias.weight
        bias = torch.stack(
            [
                torch.stack(
                    [
                        table[t5_bucket(j - i, term.relative_bias.num_buckets,
                                        term.relative_bias.max_distance), head]
                        for j in range(seq_len)
                    ]
                )
                for i in range(seq_len)
            ]
        )
        v = v + bias
        used = True
    thetas = None
    if untied is not None and untied.cls_vectors is not None:
        thetas = []
        for vector in untied.cls_vectors:
            p = layer_norm(vector, untied.layer_norm)
            thetas.append(
                (p @ untied.q_proj.weight[rows].t()) @ (p @ untied.k_proj.weight[rows].t())
                / math.sqrt(2 * head_dim)
            )
    elif term.cls_reset is not None:  # TUPE §3.3 without the untied term: two learned scalars per head
        thetas = [term.cls_reset.thetas[head, 0], term.cls_reset.thetas[head, 1]]
    if thetas is not None:
        reset = torch.zeros_like(v)
        for i in range(seq_len):
            for j in range(seq_len):
                if i == 0:
                    reset[i, j] = thetas[0]
                elif j == 0:
                    reset[i, j] = thetas[1]
                else:
                    reset[i, j] = v[i, j]
        v = reset
    return v if used else None


def dape_terms(layer, scores, biases):
    """DAPE (Zheng et al. 2024) of one layer, pair by pair: f([S_ij; B_ij]) = W_2 LeakyReLU(W_1 [S_ij; B_ij]
    + b_1) + b_2, the H scaled logits S_ij of the pair (i, j) (``scores``, one (B, T, T) a head) first, the
    H values of the content-free bias B_ij (``biases``, one (T, T) or None a head: 0) second; LeakyReLU's
    slope 0.01. Returns one (B, T, T) a head."""
    mlp = layer.self_attn.layer_terms["dape"]
    batch, seq_len, _ = scores[0].shape
    biases = [torch.zeros(seq_len, seq_len) if bias is None else bias for bias in biases]
    cells = torch.zeros(len(scores), batch, seq_len, seq_len)
    for b in range(batch):
        for i in range(seq_len):
            for j in range(seq_len):
                x = torch.stack([s[b, i, j] for s in scores] + [bias[i, j] for bias in biases])
                hidden = mlp.hidden.weight @ x + mlp.hidden.bias
                hidden = torch.where(hidden > 0, hidden, 0.01 * hidden)
                cells[:, b, i, j] = mlp.output.weight @ hidden + mlp.output.bias
    return list(cells)


def token_positions(encoder, batch, seq_len):
    """Each row's positions: 0..T-1, or in training with --randomized-positions L (Ruoss et al. 2023 §3) an
    ordered sample of T distinct positions of [0, L) for each row: a uniform key for each position of [0, L),
    drawn from torch's global generator for the B rows at once, and the T positions of the smallest keys in
    increasing order."""
    length = encoder.config.randomized_positions
    if not (encoder.training and length > 0):
        return [list(range(seq_len))] * batch
    keys = torch.rand(batch, length)
    return [sorted(keys[row].argsort()[:seq_len].tolist()) for row in range(batch)]


def attention_layer(encoder, layer, x, padding_mask, query=None, positions=None):
    """One layer's multi-head attention output for x (B, T, C), head by head; with ``query`` (B, T, C) the
    queries are read from it, the keys and values from x (DeBERTa's Enhanced Mask Decoder); ``positions``
    each row's (:func:`token_positions`, by default 0..T-1), read by RoPE."""
    attn = layer.self_attn
    batch, seq_len, embed_dim = x.shape
    head_dim = attn.head_dim
    w, b = attn.in_proj.weight, attn.in_proj.bias
    term = encoder.positional_term
    per_head = []
    for h in range(attn.num_heads):
        rows = slice(h * head_dim, (h + 1) * head_dim)
        q = (x if query is None else query) @ w[:embed_dim][rows].t() + b[:embed_dim][rows]
        k = x @ w[embed_dim : 2 * embed_dim][rows].t() + b[embed_dim : 2 * embed_dim][rows]
        v = x @ w[2 * embed_dim :][rows].t() + b[2 * embed_dim :][rows]
        if encoder.config.rotary_applies:
            frequencies = term.rotary.sinusoid.frequencies
            q = rotated(q, encoder.config, frequencies, positions)
            k = rotated(k, encoder.config, frequencies, positions)
        if encoder.config.four_term:
            untied = term.untied_position
            p = layer_norm(untied.embed_positions.weight[:seq_len], untied.layer_norm)
            pq = p @ untied.q_proj.weight[rows].t()
            pk = p @ untied.k_proj.weight[rows].t()
            logits = (
                q @ k.transpose(1, 2) + q @ pk.t() + (pq @ k.transpose(1, 2)) + pq @ pk.t()
            ) / math.sqrt(4 * head_dim)
        elif encoder.config.untied:
            logits = q @ k.transpose(1, 2) / math.sqrt(2 * head_dim)
        elif encoder.config.deberta:
            logits = (q @ k.transpose(1, 2) + deberta_position_terms(encoder, layer, q, k, h)) \
                / math.sqrt(3 * head_dim)
        elif encoder.config.uses("transformer_xl"):
            logits = xl_logits(encoder, layer, q, k, h) / math.sqrt(head_dim)
        else:
            logits = q @ k.transpose(1, 2) / math.sqrt(head_dim)
        scores = logits
        if encoder.config.uses("cope"):
            logits = logits + cope_logits(layer, q, scores, padding_mask)
        correlation = content_free_correlation(encoder, seq_len, h)
        if correlation is not None:
            logits = logits + correlation
        shaw = term.shaw
        a = None
        if shaw is not None:
            scale = (logits.new_tensor(q.size(-1))
                     * (2 if encoder.config.untied else 4 if encoder.config.four_term else 1)) ** -0.5
            a = [[shaw_vector(encoder, j - i) for j in range(seq_len)] for i in range(seq_len)]
            key_term = torch.stack([
                torch.stack([q[:, i] @ a[i][j] for j in range(seq_len)], -1)
                for i in range(seq_len)
            ], 1)
            logits = logits + key_term * scale
        per_head.append((logits, scores, correlation, v, a))
    if encoder.config.dape:
        terms = dape_terms(layer, [scores for _, scores, *_ in per_head],
                           [correlation for _, _, correlation, *_ in per_head])
        per_head = [(logits + terms[h], *rest) for h, (logits, *rest) in enumerate(per_head)]
    heads = []
    for logits, _, _, v, a in per_head:
        if padding_mask is not None:
            logits = logits.masked_fill(padding_mask[:, None, :], float("-inf"))
        probs = torch.softmax(logits, -1)
        out = probs @ v
        if a is not None and encoder.config.shaw_values:
            value_term = torch.stack([
                sum(probs[:, i, j, None] * a[i][j] for j in range(seq_len))
                for i in range(seq_len)
            ], 1)
            out = out + value_term
        heads.append(out)
    out = torch.cat(heads, -1)
    return out @ attn.out_proj.weight.t() + attn.out_proj.bias


def embedded(encoder, src_tokens, positions=None):
    """The input of the first layer (B, T, C): word embeddings (+ absolute positions, of ``positions``: each
    row's, by default 0..T-1), padding zeroed."""
    padding_mask = src_tokens.eq(encoder.padding_idx)
    x = encoder.embed_tokens.weight[src_tokens]
    if encoder.embed_positions is not None:
        positions = positions or [list(range(src_tokens.size(1)))] * src_tokens.size(0)
        x = x + torch.stack([torch.stack([absolute_position(encoder, t) for t in row]) for row in positions])
    if encoder.layernorm_embedding is not None:
        x = layer_norm(x, encoder.layernorm_embedding)
    return x * (~padding_mask).unsqueeze(-1).float()


def encoder_layer(encoder, layer, x, padding_mask, query=None, positions=None):
    """One post-LN (or pre-LN) layer; with ``query`` its attention reads queries from ``query`` and keys and
    values from x, and the residual stream is the query's; ``positions`` each row's."""
    pre = layer.normalize_before
    stream = x if query is None else query
    keys = layer_norm(x, layer.self_attn_layer_norm) if pre else x
    queries = layer_norm(stream, layer.self_attn_layer_norm) if pre else stream
    out = stream + attention_layer(encoder, layer, keys, padding_mask, None if query is None else queries,
                                   positions)
    if not pre:
        out = layer_norm(out, layer.self_attn_layer_norm)
    h = layer_norm(out, layer.final_layer_norm) if pre else out
    h = F.gelu(h @ layer.fc1.weight.t() + layer.fc1.bias) @ layer.fc2.weight.t() + layer.fc2.bias
    out = out + h
    if not pre:
        out = layer_norm(out, layer.final_layer_norm)
    return out


def encoder_features(encoder, src_tokens):
    """The encoder's final hidden states (B, T, C) with dropout off (TUPE Eq. 3 input)."""
    padding_mask = src_tokens.eq(encoder.padding_idx)
    positions = token_positions(encoder, *src_tokens.shape)
    x = embedded(encoder, src_tokens, positions)
    for layer in encoder.layers:
        x = encoder_layer(encoder, layer, x, padding_mask, positions=positions)
    if encoder.layer_norm is not None:
        x = layer_norm(x, encoder.layer_norm)
    return x


def enhanced_mask_decoder_features(encoder, src_tokens):
    """DeBERTa's Enhanced Mask Decoder (He et al. 2021 §3.2, as the released masked-LM head builds it): H, the
    output of the second-to-last layer; Q_0 = H + P with P_t the learned absolute embedding of position t;
    Q_{s+1} = the last layer with queries from Q_s, keys and values from H, --deberta-emd-layers times."""
    padding_mask = src_tokens.eq(encoder.padding_idx)
    hidden = embedded(encoder, src_tokens)
    for layer in encoder.layers[:-1]:
        hidden = encoder_layer(encoder, layer, hidden, padding_mask)
    table = encoder.enhanced_mask_decoder.embed_positions.weight
    query = hidden + torch.stack([table[t] for t in range(src_tokens.size(1))])
    for _ in range(encoder.config.deberta_emd_layers):
        query = encoder_layer(encoder, encoder.layers[-1], hidden, padding_mask, query)
    if encoder.layer_norm is not None:
        query = layer_norm(query, encoder.layer_norm)
    return query


def masked_lm_logits(model, src_tokens):
    """RoBERTa's LM head (dense, GELU, LayerNorm, the tied word embeddings and a bias) on the features the
    head reads: the Enhanced Mask Decoder's with --deberta-emd, the encoder's otherwise."""
    encoder = model.encoder.sentence_encoder
    if encoder.config.deberta_emd:
        x = enhanced_mask_decoder_features(encoder, src_tokens)
    else:
        x = encoder_features(encoder, src_tokens)
    head = model.encoder.lm_head
    x = layer_norm(F.gelu(x @ head.dense.weight.t() + head.dense.bias), head.layer_norm)
    return x @ head.weight.t() + head.bias
