"""The fairseq model: RoBERTa's masked-LM encoder with every position encoding of the papers as flags.

Only what differs from ``RobertaModel`` is here, each part delegated to its module: the flags (the
position group declared by :class:`~tupe_plugin.encodings.position_config.PositionConfig`, the others by
:mod:`.model_flags`, :mod:`.embedding_init` and :mod:`.checkpoint_init`), the encoder stack
(:class:`~tupe_plugin.encoder.positional_encoder.PositionalTransformerEncoder`), the masked-LM features
(DeBERTa's Enhanced Mask Decoder with ``--deberta-emd``, :mod:`~tupe_plugin.encoder.enhanced_mask_decoder`),
attention maps for analysis (``need_attn``), span heads (:mod:`.span_head`), the checkpoint checks
(:mod:`.checkpoint_guards`) and sentencepiece hub loading (:mod:`.hub`). Classification heads, the tied
LM head, ``upgrade_state_dict_named`` and the hub interface are RoBERTa's.
"""

import contextlib
import logging

from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta import RobertaEncoder, RobertaModel
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.utils import safe_getattr
from omegaconf import OmegaConf, open_dict

from ..encodings import position_config
from ..encoder.embedding_diagnosis import log_diagnosis
from ..encodings.position_config import PositionConfig
from ..encoder.positional_encoder import PositionalTransformerEncoder
from . import checkpoint_init, embedding_init, hub, model_flags, stock_roberta
from .checkpoint_guards import check_checkpoint, check_checkpoint_matches, check_dictionary_fingerprint
from .span_head import SpanHeadsMixin
from .task_checks import check_num_classes

logger = logging.getLogger(__name__)


@register_model("tupe_roberta")
class TupeRobertaModel(SpanHeadsMixin, RobertaModel):
    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        self.init_span_heads()
        self.embed_init_coverage = None

    @classmethod
    def hub_models(cls):
        return {}

    @staticmethod
    def add_args(parser):
        """RoBERTa's flags and the plugin's, in fairseq's "Model-specific configuration" group (argparse
        prints no group nested in it: the plugin's flags would be missing from --help)."""
        RobertaModel.add_args(parser)
        PositionConfig.add_args(parser)
        model_flags.add_args(parser)
        embedding_init.add_args(parser)
        checkpoint_init.add_args(parser)

    @classmethod
    def build_model(cls, args, task):
        dictionary = task.source_dictionary
        with open_dict(args) if OmegaConf.is_config(args) else contextlib.nullcontext():
            base_architecture(args)
            model_flags.set_max_positions(args, task)
            check_dictionary_fingerprint(args, dictionary)
            task.allow_skipped_data = args.allow_skipped_data  # read by policies.skipped_data_check
            check_num_classes(task)
            model_flags.check_model_flags(args, len(dictionary))
            model = cls(args, TupeRobertaEncoder(args, dictionary))
            if not args.embed_init_applied:  # a new model, not one rebuilt for a checkpoint's weights
                checkpoint_init.initialize_from_flags(model, args, dictionary)
                model.embed_init_coverage = embedding_init.initialize_from_flags(model, args, dictionary)
                log_diagnosis(model, dictionary)
                args.embed_init_applied = True
            model_flags.apply_layer_norm_eps(model, args.layer_norm_eps)
        return model

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
        :mod:`.checkpoint_guards`; fairseq's own RoBERTa weights renamed first (:mod:`.stock_roberta`);
        logs when loaded weights replace a --embed-init-path init."""
        prefix = name + "." if name else ""
        if self.embed_init_coverage is not None:
            logger.info("the loaded checkpoint's weights replace the --embed-init-path initialisation")
        if stock_roberta.is_stock_roberta(state_dict, prefix):
            stock_roberta.to_plugin_names(state_dict, prefix, self.encoder.sentence_encoder.padding_idx)
        check_checkpoint(self, state_dict, prefix)
        super().upgrade_state_dict_named(state_dict, name)
        check_checkpoint_matches(self.state_dict(), state_dict, prefix, safe_getattr(self.args, "arch", "?"))
        self.upgrade_span_heads(state_dict, prefix)

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".",
                        bpe="sentencepiece", **kwargs):
        """Load a plugin checkpoint as RoBERTa's hub object (:func:`.hub.from_pretrained`)."""
        return hub.from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path, bpe=bpe,
                                   archive_map=cls.hub_models(), **kwargs)


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
            src_tokens, return_all_hiddens=return_all_hiddens, need_attn=need_attn,
            masked_lm=not features_only,
        )
        if not features_only:
            x = self.output_layer(x, masked_tokens=masked_tokens)
        return x, extra

    def extract_features(self, src_tokens, return_all_hiddens=False, need_attn=False, masked_lm=False,
                         **kwargs):
        """The encoder's features; with ``masked_lm``, those the LM head reads (with --deberta-emd, the
        Enhanced Mask Decoder's, :mod:`~tupe_plugin.encoder.enhanced_mask_decoder`)."""
        features, inner_states, attn = self.sentence_encoder(
            src_tokens,
            return_all_hiddens=return_all_hiddens,
            need_attn=need_attn,
            token_embeddings=kwargs.get("token_embeddings"),
            masked_lm=masked_lm,
        )
        extra = {"inner_states": inner_states}
        if need_attn:
            extra["attn"] = attn
        return features, extra


@register_model_architecture("tupe_roberta", "tupe_roberta")
def base_architecture(args):
    """Defaults for every flag a preset leaves unset: TUPE-R, base size, BERT's post-LN recipe."""
    # a config that has built a model before is a checkpoint's
    position_config.set_defaults(args, saved=safe_getattr(args, "embed_init_applied", False))
    model_flags.set_defaults(args)
    embedding_init.set_defaults(args)
    checkpoint_init.set_defaults(args)
    roberta_base_architecture(args)
