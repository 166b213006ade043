"""The fairseq model: RoBERTa's masked-LM encoder with every position encoding of the papers as flags.

Only what differs from ``RobertaModel`` is overridden: the flags, the encoder stack
(:class:`~tupe_plugin.modules.positional_encoder.PositionalTransformerEncoder`), attention maps for
analysis (``need_attn``) and sentencepiece hub loading. Classification heads, the tied LM head,
``upgrade_state_dict_named`` and the hub interface are RoBERTa's.
"""

import logging
import os

import torch.nn as nn
from fairseq import hub_utils
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta import RobertaEncoder, RobertaModel
from fairseq.models.roberta.hub_interface import RobertaHubInterface
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.utils import safe_getattr, safe_hasattr

from ..modules.absolute_position import ABS_POS_CHOICES
from ..modules.positional_encoder import PositionalTransformerEncoder
from ..modules.positional_term import CLS_RESET_CHOICES, UNTIED_CHOICES
from ..modules.pretrained_embeddings import (
    PROJECT_CHOICES,
    STANDARDIZE_CHOICES,
    embedding_position_diagnosis,
    format_diagnosis,
    initialize_embeddings,
)
from ..modules.relative_position import REL_POS_CHOICES
from .checkpoint_match import check_checkpoint_matches
from .position_flags import check_position_flags
from .span_head import SpanPredictionHead

logger = logging.getLogger(__name__)

SENTENCEPIECE_MODEL = "sentencepiece.bpe.model"


@register_model("tupe_roberta")
class TupeRobertaModel(RobertaModel):
    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        self.span_heads = nn.ModuleDict()

    @classmethod
    def hub_models(cls):
        return {}

    def register_span_head(self, name):
        """Add a start/end span head (SQuAD) named ``name``, kept in checkpoints like classification heads."""
        if name not in self.span_heads:
            self.span_heads[name] = SpanPredictionHead(self.args.encoder_embed_dim)

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        group = parser.add_argument_group("position encodings (tupe_plugin)")
        group.add_argument(
            "--abs-pos",
            choices=ABS_POS_CHOICES,
            help="absolute position embedding added to the word embedding at the input",
        )
        group.add_argument(
            "--rel-pos",
            choices=REL_POS_CHOICES,
            help="relative position term: t5 = one bias per head and distance bucket, shared by "
            "all layers (seed 001 Eq. 5/8); shaw-* = Shaw vectors a_clip(j-i) added to keys and "
            "values, one table shared by heads and layers, learned / fixed sinusoidal / "
            "learnable-frequency sinusoidal (seed 000 Eq. 4)",
        )
        group.add_argument(
            "--rel-pos-buckets", type=int, metavar="N", help="T5 buckets (both directions)"
        )
        group.add_argument(
            "--rel-pos-max-distance",
            type=int,
            metavar="N",
            help="T5 distance beyond which all offsets share the last bucket",
        )
        group.add_argument(
            "--shaw-max-distance",
            type=int,
            metavar="K",
            help="Shaw relative distances are clipped to [-K, K] (default 64)",
        )
        group.add_argument(
            "--shaw-keys-only",
            action="store_true",
            help="add the Shaw vectors to the keys only, not to the values",
        )
        group.add_argument(
            "--untied-pos",
            choices=UNTIED_CHOICES,
            help="position-to-position term computed in attention: tupe = untied "
            "(pU^Q)(pU^K)^T/sqrt(2d_h) (seed 001 Eq. 7); four-term = the BERT-A^d ablation",
        )
        group.add_argument(
            "--cls-reset",
            choices=CLS_RESET_CHOICES,
            help="paper = reset the content-free correlations from/to [CLS] to learned "
            "theta_1/theta_2 (seed 001 Eq. 9); release = as the authors' released code: "
            "theta_1/theta_2 from the untied table's rows 0 and 1 (the table gets "
            "max_positions + 1 rows), the T5 bias reset on its own to two extra buckets",
        )
        group.add_argument(
            "--untied-proj-bias",
            action="store_true",
            help="give the untied projections U^Q/U^K a bias, as the authors' released code does",
        )
        group.add_argument(
            "--no-layernorm-embedding",
            action="store_true",
            help="no LayerNorm on the input embeddings (the presets use one, as BERT does)",
        )
        group = parser.add_argument_group("pre-trained embeddings (tupe_plugin, seed 002)")
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

    @classmethod
    def build_model(cls, args, task):
        from omegaconf import OmegaConf

        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, False)
        base_architecture(args)
        if not safe_hasattr(args, "max_positions"):
            if not safe_hasattr(args, "tokens_per_sample"):
                args.tokens_per_sample = task.max_positions()
            args.max_positions = args.tokens_per_sample
        check_position_flags(args)
        encoder = TupeRobertaEncoder(args, task.source_dictionary)
        model = cls(args, encoder)
        if not args.embed_init_applied:
            model.initialize_from_flags(args, task.source_dictionary)
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, True)
        return model

    def initialize_from_flags(self, args, dictionary):
        """--embed-init-* on a new model, then the seed 002 diagnosis, both logged.

        ``args.embed_init_applied`` is then set, so a config saved in a checkpoint never re-reads the
        vectors when the model is rebuilt to receive the checkpoint's weights (fairseq-validate,
        from_pretrained); fairseq-train resuming rebuilds from its command line, and the loaded
        checkpoint's weights then replace this init.
        """
        embed_tokens = self.encoder.sentence_encoder.embed_tokens
        if args.embed_init_path:
            self.embed_init_coverage = initialize_embeddings(embed_tokens, dictionary, args)
        diagnosis = embedding_position_diagnosis(self, dictionary)
        logger.info(f"embeddings vs positions at initialisation: {format_diagnosis(diagnosis)}")
        args.embed_init_applied = True

    def forward(
        self,
        src_tokens,
        features_only=False,
        return_all_hiddens=False,
        classification_head_name=None,
        need_attn=False,
        span_head_name=None,
        **kwargs,
    ):
        """RoBERTa's forward; ``need_attn=True`` also returns each layer's attention in extra["attn"].

        ``span_head_name`` returns that span head's ``(start_logits, end_logits)``, each (B, T), instead.
        """
        if span_head_name is not None:
            features, extra = self.encoder(
                src_tokens, features_only=True, return_all_hiddens=return_all_hiddens,
                need_attn=need_attn, **kwargs,
            )
            return self.span_heads[span_head_name](features), extra
        return super().forward(
            src_tokens,
            features_only=features_only,
            return_all_hiddens=return_all_hiddens,
            classification_head_name=classification_head_name,
            need_attn=need_attn,
            **kwargs,
        )

    def upgrade_state_dict_named(self, state_dict, name):
        """RoBERTa's upgrades (span heads kept like classification heads), after refusing a checkpoint
        of another architecture or vocabulary, learned position tables of another length and
        position tables or projections the flags do not match.

        Also logs when the loaded weights replace a --embed-init-path initialisation (resuming).
        """
        prefix = name + "." if name else ""
        if getattr(self, "embed_init_coverage", None) is not None:
            logger.info("the loaded checkpoint's weights replace the --embed-init-path initialisation")
        own_keys = self.state_dict()
        for key, table in own_keys.items():
            saved = state_dict.get(prefix + key)
            if key.endswith("embed_positions.weight") and saved is not None \
                    and saved.shape[1:] == table.shape[1:] and saved.size(0) != table.size(0):
                extra_rows = table.size(0) - self.args.max_positions
                if saved.size(0) == table.size(0) + 1 and self.args.cls_reset != "release":
                    raise ValueError(
                        f"the checkpoint's position table {key} has one row more than the model's: "
                        "it keeps the authors' released semantics (scripts/convert_official_tupe.py); "
                        "build the model with --cls-reset release --untied-proj-bias"
                    )
                raise ValueError(
                    f"the checkpoint's learned position table {key} has "
                    f"{saved.size(0) - extra_rows} positions but the model is built for "
                    f"--max-positions {self.args.max_positions}; a learned table cannot change "
                    f"length: use --max-positions {saved.size(0) - extra_rows} (architectures "
                    "with sinusoidal, T5 or Shaw positions, or none, accept longer inputs)"
                )
        for key in (k for k in own_keys if k.endswith("untied_position.q_proj.weight")):
            bias = key[: -len("weight")] + "bias"
            saved_bias = prefix + bias in state_dict
            if prefix + key in state_dict and saved_bias != (bias in own_keys):
                raise ValueError(
                    f"the checkpoint's untied projections U^Q/U^K have {'a' if saved_bias else 'no'} "
                    f"bias ({bias}): build the model {'with' if saved_bias else 'without'} "
                    "--untied-proj-bias"
                )
        super().upgrade_state_dict_named(state_dict, name)
        check_checkpoint_matches(self.state_dict(), state_dict, prefix, safe_getattr(self.args, "arch", "?"))
        self._upgrade_span_heads(state_dict, prefix)

    def _upgrade_span_heads(self, state_dict, prefix):
        """Span heads in the checkpoint are loaded (``load_checkpoint_heads``) or dropped; heads the
        checkpoint lacks (fine-tuning from a masked-LM checkpoint) start from their initial weights."""
        head_prefix = prefix + "span_heads."
        for key in [k for k in state_dict if k.startswith(head_prefix)]:
            head_name = key[len(head_prefix):].split(".")[0]
            if head_name not in self.span_heads:
                if safe_getattr(self.args, "load_checkpoint_heads", False):
                    self.register_span_head(head_name)
                else:
                    logger.warning("deleting span head (%s) not present in the current model", key)
                    del state_dict[key]
        for key, value in self.span_heads.state_dict().items():
            state_dict.setdefault(head_prefix + key, value)

    @classmethod
    def from_pretrained(
        cls,
        model_name_or_path,
        checkpoint_file="model.pt",
        data_name_or_path=".",
        bpe="sentencepiece",
        **kwargs,
    ):
        """Load a plugin checkpoint as RoBERTa's hub object (``encode``, ``extract_features``, ``predict``).

        The sentencepiece model is ``sentencepiece_model=`` or a ``sentencepiece.bpe.model`` next to
        the checkpoint or in the data directory (``data_name_or_path``, holding ``dict.txt``).
        """
        if bpe == "sentencepiece" and "sentencepiece_model" not in kwargs:
            kwargs["sentencepiece_model"] = _find_sentencepiece_model(
                model_name_or_path, data_name_or_path
            )
        loaded = hub_utils.from_pretrained(
            model_name_or_path,
            checkpoint_file,
            data_name_or_path,
            archive_map=cls.hub_models(),
            bpe=bpe,
            load_checkpoint_heads=True,
            **kwargs,
        )
        return RobertaHubInterface(loaded["args"], loaded["task"], loaded["models"][0])


def _find_sentencepiece_model(model_dir, data_dir):
    candidates = [os.path.join(model_dir, SENTENCEPIECE_MODEL)]
    if data_dir:
        candidates.append(os.path.join(model_dir, data_dir, SENTENCEPIECE_MODEL))
        candidates.append(os.path.join(data_dir, SENTENCEPIECE_MODEL))
    for path in candidates:
        if os.path.isfile(path):
            return os.path.abspath(path)
    raise FileNotFoundError(
        f"no {SENTENCEPIECE_MODEL} in {', '.join(candidates)}: pass sentencepiece_model=PATH "
        "(the model used to encode the pre-training data) or bpe=None to feed token ids"
    )


class TupeRobertaEncoder(RobertaEncoder):
    """RoBERTa's encoder (embeddings, tied LM head) over the plugin's positional encoder stack."""

    def build_encoder(self, args, dictionary, embed_tokens):
        return PositionalTransformerEncoder(args, embed_tokens)

    def forward(
        self,
        src_tokens,
        features_only=False,
        return_all_hiddens=False,
        masked_tokens=None,
        need_attn=False,
        **unused,
    ):
        x, extra = self.extract_features(
            src_tokens, return_all_hiddens=return_all_hiddens, need_attn=need_attn
        )
        if not features_only:
            x = self.output_layer(x, masked_tokens=masked_tokens)
        return x, extra

    def extract_features(self, src_tokens, return_all_hiddens=False, need_attn=False, **kwargs):
        features, inner_states, attn = self.sentence_encoder(
            src_tokens,
            return_all_hiddens=return_all_hiddens,
            need_attn=need_attn,
            token_embeddings=kwargs.get("token_embeddings"),
        )
        extra = {"inner_states": inner_states}
        if need_attn:
            extra["attn"] = attn
        return features, extra


@register_model_architecture("tupe_roberta", "tupe_roberta")
def base_architecture(args):
    """Defaults for every flag a preset leaves unset: TUPE-R, base size, BERT's post-LN recipe."""
    args.abs_pos = safe_getattr(args, "abs_pos", "none")
    args.rel_pos = safe_getattr(args, "rel_pos", "t5")
    args.rel_pos_buckets = safe_getattr(args, "rel_pos_buckets", 32)
    args.rel_pos_max_distance = safe_getattr(args, "rel_pos_max_distance", 128)
    args.shaw_max_distance = safe_getattr(args, "shaw_max_distance", 64)
    args.shaw_keys_only = safe_getattr(args, "shaw_keys_only", False)
    args.untied_pos = safe_getattr(args, "untied_pos", "tupe")
    args.cls_reset = safe_getattr(args, "cls_reset", "paper")
    args.untied_proj_bias = safe_getattr(args, "untied_proj_bias", False)
    args.layernorm_embedding = not safe_getattr(args, "no_layernorm_embedding", False)
    args.embed_init_path = safe_getattr(args, "embed_init_path", None)
    args.embed_init_dict = safe_getattr(args, "embed_init_dict", None)
    args.embed_init_standardize = safe_getattr(args, "embed_init_standardize", "none")
    args.embed_init_project = safe_getattr(args, "embed_init_project", "none")
    args.embed_init_applied = safe_getattr(args, "embed_init_applied", False)
    roberta_base_architecture(args)
