"""``--embed-init-*``: the word embeddings of a new model from pre-trained vectors.

Kang et al., "On Initializing Transformers with Pre-trained Embeddings", arXiv 2407.12514; the reading,
matching and standardising are :mod:`tupe_plugin.encoder.pretrained_embeddings`. Only a new model is
initialised: once done, ``args.embed_init_applied`` is set, so a config saved in a checkpoint never
re-reads the vectors when the model is rebuilt to receive the checkpoint's weights (fairseq-validate,
from_pretrained); fairseq-train resuming rebuilds from its command line, and the loaded checkpoint's
weights then replace this init.
"""

from fairseq.utils import safe_getattr

from ..encoder.pretrained_embeddings import PROJECT_CHOICES, STANDARDIZE_CHOICES, initialize_embeddings


def add_args(group):
    group.add_argument(
        "--embed-init-path",
        metavar="FILE",
        help="initialise the word embeddings of a new model from word2vec/GloVe text "
        "('token v1 ... vd' lines, optional 'N d' header) or a fairseq checkpoint; rows whose "
        "symbol is not in the file keep the random init (ignored when weights are loaded "
        "from a checkpoint)",
    )
    group.add_argument(
        "--embed-init-dict",
        metavar="FILE",
        help="dictionary of a --embed-init-path checkpoint (default: dict.txt next to it, "
        "then the dict.txt of the data it was trained on)",
    )
    group.add_argument(
        "--embed-init-standardize",
        choices=STANDARDIZE_CHOICES,
        help="rescale the matched vectors: none; std = zero mean and fairseq's init std "
        "0.02; xavier = min-max onto the Xavier-uniform range +-sqrt(6/(vocab+dim))",
    )
    group.add_argument(
        "--embed-init-project",
        choices=PROJECT_CHOICES,
        help="map vectors of another size to --encoder-embed-dim: pca (top principal "
        "components) or random (Gaussian projection); none = refuse a size mismatch",
    )


def set_defaults(args):
    args.embed_init_path = safe_getattr(args, "embed_init_path", None)
    args.embed_init_dict = safe_getattr(args, "embed_init_dict", None)
    args.embed_init_standardize = safe_getattr(args, "embed_init_standardize", "none")
    args.embed_init_project = safe_getattr(args, "embed_init_project", "none")
    args.embed_init_applied = safe_getattr(args, "embed_init_applied", False)


def initialize_from_flags(model, args, dictionary):
    """Copy the ``--embed-init-path`` vectors into the word embeddings of a new ``model``; the
    coverage counts, or None without the flag."""
    if not args.embed_init_path:
        return None
    return initialize_embeddings(model.encoder.sentence_encoder.embed_tokens, dictionary, args)
