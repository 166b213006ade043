"""The fairseq model: RoBERTa's masked-LM encoder with every position encoding of the papers as flags.

Only what differs from ``RobertaModel`` is overridden: the flags, the encoder stack
(:class:`~tupe_plugin.modules.positional_encoder.PositionalTransformerEncoder`), attention maps for
analysis (``need_attn``), span heads (:mod:`.span_head`), the checkpoint checks
(:mod:`.checkpoint_guards`) and sentencepiece hub loading. Classification heads, the tied LM head,
``upgrade_state_dict_named`` and the hub interface are RoBERTa's.
"""

import logging
import os

from fairseq import hub_utils
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta import RobertaEncoder, RobertaModel
from fairseq.models.roberta.hub_interface import RobertaHubInterface
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.utils import safe_getattr, safe_hasattr

from ..modules import position_config
from ..modules.position_config import (
    ABS_POS_CHOICES,
    CLS_RESET_CHOICES,
    REL_POS_CHOICES,
    ROTARY_CHOICES,
    UNTIED_CHOICES,
)
from ..modules.positional_encoder import PositionalTransformerEncoder
from ..modules.pretrained_embeddings import (
    PROJECT_CHOICES,
    STANDARDIZE_CHOICES,
    embedding_position_diagnosis,
    format_diagnosis,
    initialize_embeddings,
)
from .checkpoint_guards import check_checkpoint, check_checkpoint_matches, check_dictionary_fingerprint
from .span_head import SpanHeadsMixin
from .task_checks import check_num_classes

logger = logging.getLogger(__name__)

SENTENCEPIECE_MODEL = "sentencepiece.bpe.model"


@register_model("tupe_roberta")
class TupeRobertaModel(SpanHeadsMixin, RobertaModel):
    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        self.init_span_heads()

    @classmethod
    def hub_models(cls):
        return {}

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
            "all layers (TUPE Eq. 5/8); alibi = the fixed bias -m_h|j-i| (Press et al. 2022); "
            "shaw-* = Shaw vectors a_clip(j-i) added to keys and values, one table shared by heads "
            "and layers, learned / fixed sinusoidal / learnable-frequency sinusoidal (Wang et al. "
            "2021 Eq. 4)",
        )
        group.add_argument(
            "--rotary",
            choices=ROTARY_CHOICES,
            help="rotary position embedding (RoPE, Su et al. 2021): q and k of every layer rotated "
            "by position; learnable = the d_h/2 frequencies are parameters initialised at the fixed ones",
        )
        group.add_argument(
            "--rotary-base", type=float, metavar="B", help="RoPE's frequency base (default 10000)"
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
            "(pU^Q)(pU^K)^T/sqrt(2d_h) (TUPE Eq. 7); four-term = the BERT-A^d ablation",
        )
        group.add_argument(
            "--cls-reset",
            choices=CLS_RESET_CHOICES,
            help="paper = reset the content-free correlations from/to [CLS] to learned "
            "theta_1/theta_2 (TUPE Eq. 9); release = as the authors' released code: "
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
        parser.add_argument(
            "--allow-skipped-data",
            action="store_true",
            help="train although more than 1%% of the training tokens are in samples longer than "
            "--max-positions, which fairseq skips (the plugin stops such a run by default)",
        )
        group = parser.add_argument_group("pre-trained embeddings (tupe_plugin, Kang et al.)")
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
        check_dictionary_fingerprint(args, task.source_dictionary)
        task.allow_skipped_data = args.allow_skipped_data  # read by policies.skipped_data_check
        check_num_classes(task)
        encoder = TupeRobertaEncoder(args, task.source_dictionary)
        model = cls(args, encoder)
        if not args.embed_init_applied:
            model.initialize_from_flags(args, task.source_dictionary)
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, True)
        return model

    def initialize_from_flags(self, args, dictionary):
        """--embed-init-* on a new model, then the Kang et al. diagnosis, both logged.

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
            return self.span_logits(span_head_name, features), extra
        return super().forward(
            src_tokens,
            features_only=features_only,
            return_all_hiddens=return_all_hiddens,
            classification_head_name=classification_head_name,
            need_attn=need_attn,
            **kwargs,
        )

    def upgrade_state_dict_named(self, state_dict, name):
        """RoBERTa's upgrades (span heads kept like classification heads), after the checks of
        :mod:`.checkpoint_guards`; logs when loaded weights replace a --embed-init-path init."""
        prefix = name + "." if name else ""
        if getattr(self, "embed_init_coverage", None) is not None:
            logger.info("the loaded checkpoint's weights replace the --embed-init-path initialisation")
        check_checkpoint(self, state_dict, prefix)
        super().upgrade_state_dict_named(state_dict, name)
        check_checkpoint_matches(self.state_dict(), state_dict, prefix, safe_getattr(self.args, "arch", "?"))
        self.upgrade_span_heads(state_dict, prefix)

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
        The object is returned in eval mode (no dropout: the same input gives the same features);
        call ``.train()`` on it to fine-tune.
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
        hub = RobertaHubInterface(loaded["args"], loaded["task"], loaded["models"][0])
        return hub.eval()


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
    position_config.set_defaults(args)
    args.embed_init_path = safe_getattr(args, "embed_init_path", None)
    args.embed_init_dict = safe_getattr(args, "embed_init_dict", None)
    args.embed_init_standardize = safe_getattr(args, "embed_init_standardize", "none")
    args.embed_init_project = safe_getattr(args, "embed_init_project", "none")
    args.embed_init_applied = safe_getattr(args, "embed_init_applied", False)
    args.allow_skipped_data = safe_getattr(args, "allow_skipped_data", False)
    roberta_base_architecture(args)
