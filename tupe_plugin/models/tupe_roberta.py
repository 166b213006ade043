"""The fairseq model: RoBERTa's masked-LM encoder with every position encoding of the papers as flags.

Only what differs from ``RobertaModel`` is overridden: the flags, the encoder stack
(:class:`~tupe_plugin.modules.positional_encoder.PositionalTransformerEncoder`), attention maps for
analysis (``need_attn``) and sentencepiece hub loading. Classification heads, the tied LM head,
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

from ..modules.absolute_position import ABS_POS_CHOICES
from ..modules.positional_encoder import PositionalTransformerEncoder
from ..modules.positional_term import CLS_RESET_CHOICES, UNTIED_CHOICES
from ..modules.relative_position import REL_POS_CHOICES
from .position_flags import check_position_flags

logger = logging.getLogger(__name__)

SENTENCEPIECE_MODEL = "sentencepiece.bpe.model"


@register_model("tupe_roberta")
class TupeRobertaModel(RobertaModel):
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
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, True)
        return cls(args, encoder)

    def forward(
        self,
        src_tokens,
        features_only=False,
        return_all_hiddens=False,
        classification_head_name=None,
        need_attn=False,
        **kwargs,
    ):
        """RoBERTa's forward; ``need_attn=True`` also returns each layer's attention in extra["attn"]."""
        return super().forward(
            src_tokens,
            features_only=features_only,
            return_all_hiddens=return_all_hiddens,
            classification_head_name=classification_head_name,
            need_attn=need_attn,
            **kwargs,
        )

    def upgrade_state_dict_named(self, state_dict, name):
        """RoBERTa's upgrades, after refusing position tables and projections the flags do not match."""
        prefix = name + "." if name else ""
        own_keys = self.state_dict()
        for key, table in own_keys.items():
            saved = state_dict.get(prefix + key)
            if key.endswith("embed_positions.weight") and saved is not None \
                    and saved.shape != table.shape:
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
    roberta_base_architecture(args)
