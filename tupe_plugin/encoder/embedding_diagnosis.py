"""How much of the position signal survives in the input: word vs position scale, and a linear probe.

Kang et al. ("On Initializing Transformers with Pre-trained Embeddings", arXiv 2407.12514, §5) find that
word vectors with a wide value range, added to the much smaller position embeddings, absorb the position
information. Measured before training (the model's build logs it) and by the analysis report: the mean
norms of words and positions, their ratio, and how well a linear map recovers the position from
word + position.
"""

import logging

import torch

logger = logging.getLogger(__name__)

def mean_norm(vectors):
    return vectors.norm(dim=-1).mean().item()


def position_probe_r2(words, positions, num_samples=4096, ridge=1e-3, seed=0):
    """How well a linear map recovers the position index t from x = word + position_t (Kang et al. §5).

    ``words`` (V, d) and ``positions`` (T, d). Pairs (w, t) are drawn uniformly; the words are split in
    two disjoint halves, the probe is fit on pairs of the first half and scored on pairs of the held-out
    half (so it cannot memorise words). Closed-form ridge regression with an intercept,
    lambda = ridge * mean diagonal of the centred Gram matrix. Returns the held-out R^2 (1 = position fully
    recoverable, <= 0 = no better than predicting the mean position).
    """
    generator = torch.Generator().manual_seed(seed)
    words, positions = words.detach().double(), positions.detach().double()
    order = torch.randperm(words.size(0), generator=generator)
    split = max(1, words.size(0) // 2)
    halves = (order[:split], order[split:]) if words.size(0) > 1 else (order, order)

    def sample(word_pool):
        w = word_pool[torch.randint(len(word_pool), (num_samples,), generator=generator)]
        t = torch.randint(positions.size(0), (num_samples,), generator=generator)
        return words[w] + positions[t], t.double()

    x_fit, y_fit = sample(halves[0])
    x_test, y_test = sample(halves[1])
    x_mean, y_mean = x_fit.mean(0), y_fit.mean()
    centred = x_fit - x_mean
    gram = centred.T @ centred
    penalty = ridge * gram.diagonal().mean().clamp_min(1e-12)
    coefficients = torch.linalg.solve(
        gram + penalty * torch.eye(gram.size(0), dtype=gram.dtype), centred.T @ (y_fit - y_mean)
    )
    predicted = (x_test - x_mean) @ coefficients + y_mean
    residual = ((y_test - predicted) ** 2).sum()
    total = ((y_test - y_test.mean()) ** 2).sum()
    return (1 - residual / total).item()


def embedding_position_diagnosis(model, dictionary=None, num_samples=4096, seed=0):
    """Word vs position scale in the input of ``model`` (a plugin model or an encoder of it), and the probe.

    Returns a dict:
    ``position_input``: ``"added"`` (an absolute PE is summed with the word embedding), ``"untied"``
    (TUPE / BERT-A^d: p = LayerNorm(P) enters attention apart from the words) or ``"none"``;
    ``word_norm``: mean L2 norm of the word embeddings (padding and, with ``dictionary``, its special
    symbols excluded); ``position_norm``: mean norm of the absolute PE rows P_t (added) or of p_t (untied),
    None without positions; ``ratio``: word_norm / position_norm when added (the absorption ratio), None
    otherwise; ``probe_r2``: held-out R^2 of :func:`position_probe_r2` on word + P_t, and
    ``probe_r2_positions_only`` the same with zero words (the ceiling), None unless added;
    ``num_positions``: positions compared.
    """
    encoder = getattr(model, "encoder", model)
    encoder = getattr(encoder, "sentence_encoder", encoder)
    weight = encoder.embed_tokens.weight.detach()
    keep = torch.ones(weight.size(0), dtype=torch.bool)
    keep[encoder.padding_idx] = False
    if dictionary is not None and len(dictionary) > dictionary.nspecial + 1:
        keep[: dictionary.nspecial] = False
    words = weight[keep].float()
    result = {
        "position_input": "none",
        "word_norm": mean_norm(words),
        "position_norm": None,
        "ratio": None,
        "probe_r2": None,
        "probe_r2_positions_only": None,
        "num_positions": 0,
    }
    with torch.no_grad():
        if encoder.embed_positions is not None:
            positions = encoder.embed_positions(encoder.max_positions).float()
            result.update(position_input="added", position_norm=mean_norm(positions))
            result["ratio"] = result["word_norm"] / result["position_norm"]
            result["probe_r2"] = position_probe_r2(words, positions, num_samples, seed=seed)
            result["probe_r2_positions_only"] = position_probe_r2(
                torch.zeros_like(words), positions, num_samples, seed=seed
            )
        elif encoder.positional_term.untied_position is not None:
            untied = encoder.positional_term.untied_position
            positions = untied.positions(untied.max_positions).float()
            result.update(position_input="untied", position_norm=mean_norm(positions))
        result["num_positions"] = 0 if result["position_norm"] is None else positions.size(0)
    return result


def format_diagnosis(result):
    """One log line for :func:`embedding_position_diagnosis`."""
    if result["position_input"] == "added":
        return (
            f"word embeddings mean norm {result['word_norm']:.4g}, absolute positions "
            f"{result['position_norm']:.4g} (ratio {result['ratio']:.3g}); linear probe recovers the "
            f"position from word + position with held-out R^2 {result['probe_r2']:.3f} "
            f"(positions alone {result['probe_r2_positions_only']:.3f})"
        )
    if result["position_input"] == "untied":
        return (
            f"word embeddings mean norm {result['word_norm']:.4g}; no position is added to the input "
            f"(untied p = LayerNorm(P), mean norm {result['position_norm']:.4g}, enters attention on "
            "its own): the word scale cannot absorb it, no ratio or probe"
        )
    return (
        f"word embeddings mean norm {result['word_norm']:.4g}; no absolute position in this "
        "architecture (relative terms, if any, are in attention): no ratio or probe"
    )


def log_diagnosis(model, dictionary):
    """Log the diagnosis of a model at initialisation (its build, before any training)."""
    logger.info(f"embeddings vs positions at initialisation: "
                f"{format_diagnosis(embedding_position_diagnosis(model, dictionary))}")
