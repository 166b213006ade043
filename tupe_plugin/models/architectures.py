"""Named architectures: every paper row (README, Architectures) in every size; any flag on the command line
wins."""

from fairseq.models import register_model_architecture
from fairseq.utils import safe_getattr

from .tupe_roberta import base_architecture

SIZES = {
    # layers, embed dim, heads, FFN dim
    "tiny": (2, 128, 4, 512),
    "medium": (8, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}

NO_POSITION = dict(abs_pos="none", rel_pos="none", untied_pos="none", cls_reset="none", rotary="none")

POSITION_PRESETS = {
    "bert_a": dict(NO_POSITION, abs_pos="learned"),
    "bert_r": dict(NO_POSITION, abs_pos="learned", rel_pos="t5"),
    "tupe_a": dict(NO_POSITION, untied_pos="tupe", cls_reset="paper"),
    "tupe_r": dict(NO_POSITION, rel_pos="t5", untied_pos="tupe", cls_reset="paper"),
    "tupe_a_tie_cls": dict(NO_POSITION, untied_pos="tupe"),
    "bert_a_d": dict(NO_POSITION, untied_pos="four-term"),
}

# The other position encodings of "On Position Embeddings in BERT" (Wang et al. 2021, Tables 2 and 3);
# its fully learnable APE is bert_a above.
LEARNED, LSIN = "learned", "learnable-sinusoidal"
RPE, SIN_RPE, LSIN_RPE = "shaw-learned", "shaw-sinusoidal", "shaw-learnable-sinusoidal"
POSITION_PRESETS.update(
    bert_nope=dict(NO_POSITION),
    bert_sin_ape=dict(NO_POSITION, abs_pos="sinusoidal"),
    bert_lsin_ape=dict(NO_POSITION, abs_pos=LSIN),
    bert_rpe=dict(NO_POSITION, rel_pos=RPE),
    bert_sin_rpe=dict(NO_POSITION, rel_pos=SIN_RPE),
    bert_lsin_rpe=dict(NO_POSITION, rel_pos=LSIN_RPE),
    bert_a_rpe=dict(NO_POSITION, abs_pos=LEARNED, rel_pos=RPE),
    bert_a_sin_rpe=dict(NO_POSITION, abs_pos=LEARNED, rel_pos=SIN_RPE),
    bert_a_lsin_rpe=dict(NO_POSITION, abs_pos=LEARNED, rel_pos=LSIN_RPE),
    bert_lsin_ape_rpe=dict(NO_POSITION, abs_pos=LSIN, rel_pos=RPE),
    bert_lsin_ape_sin_rpe=dict(NO_POSITION, abs_pos=LSIN, rel_pos=SIN_RPE),
    bert_lsin_ape_lsin_rpe=dict(NO_POSITION, abs_pos=LSIN, rel_pos=LSIN_RPE),
)

# Beyond the papers: the encodings that position-encoding studies compare against today.
POSITION_PRESETS.update(
    bert_rope=dict(NO_POSITION, rotary="fixed"),
    bert_lrope=dict(NO_POSITION, rotary="learnable"),
    bert_alibi=dict(NO_POSITION, rel_pos="alibi"),
    bert_alibi_cls=dict(NO_POSITION, rel_pos="alibi", cls_reset="paper"),
    bert_alibi_asym=dict(NO_POSITION, rel_pos="alibi", alibi_asymmetric=True, alibi_learned_slopes=True),
    bert_kerple=dict(NO_POSITION, rel_pos="kerple-log"),
    bert_sandwich=dict(NO_POSITION, rel_pos="sandwich"),
    bert_fire=dict(NO_POSITION, rel_pos="fire"),
    tupe_rope=dict(NO_POSITION, untied_pos="tupe", cls_reset="paper", rotary="fixed"),
    # DeBERTa's disentangled attention (He et al. 2021, Eq. 4), v1: no absolute position, own W^{q,r}, W^{k,r}
    deberta=dict(NO_POSITION, rel_pos="deberta"),
    # and its Enhanced Mask Decoder (§3.2): absolute positions only before the masked-LM head
    deberta_emd=dict(NO_POSITION, rel_pos="deberta", deberta_emd=True),
    # Transformer-XL's relative encoding (Dai et al. 2019 §3.3), bidirectional as XLNet
    bert_xl=dict(NO_POSITION, rel_pos="xl"),
    # CoPE's contextual positions (Golovneva et al. 2024), counted in both directions
    bert_cope=dict(NO_POSITION, rel_pos="cope"),
    # DAPE (Zheng et al. 2024): each layer's MLP over its logits and the distance bias, on KERPLE and ALiBi
    bert_dape_kerple=dict(NO_POSITION, rel_pos="kerple-log", dape=True),
    bert_dape_alibi=dict(NO_POSITION, rel_pos="alibi", dape=True),
    # RoPE at randomized positions (Ruoss et al. 2023 §3): each training sequence's positions are sampled
    # from [0, L), which should cover the longest evaluation length; L = 4096 is 8 x the usual --max-positions
    # 512, the longest length examples/modern.yaml validates at, so that every position it reads was trained
    bert_rope_randomized=dict(NO_POSITION, rotary="fixed", randomized_positions=4096),
)


def _preset(position, size):
    layers, embed_dim, heads, ffn_dim = SIZES[size]

    def architecture(args):
        args.encoder_layers = safe_getattr(args, "encoder_layers", layers)
        args.encoder_embed_dim = safe_getattr(args, "encoder_embed_dim", embed_dim)
        args.encoder_attention_heads = safe_getattr(args, "encoder_attention_heads", heads)
        args.encoder_ffn_embed_dim = safe_getattr(args, "encoder_ffn_embed_dim", ffn_dim)
        for flag, value in POSITION_PRESETS[position].items():
            setattr(args, flag, safe_getattr(args, flag, value))
        base_architecture(args)

    architecture.__name__ = f"{position}_{size}"
    architecture.__doc__ = f"{position} position encoding, {size} size {SIZES[size]}"
    return architecture


ARCHITECTURES = {}
for _position in POSITION_PRESETS:
    for _size in SIZES:
        _name = f"{_position}_{_size}"
        ARCHITECTURES[_name] = register_model_architecture("tupe_roberta", _name)(
            _preset(_position, _size)
        )
