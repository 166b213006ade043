"""The configuration of a tupe-plugin encoder exported to transformers (``model_type`` "tupe").

Self-contained: it imports transformers only, and is copied into every export (``trust_remote_code``).
The sizes are BERT's names; the position encoding is the plugin's flags, under their own names; the
checkpoint's model flags are kept whole in ``fairseq_model_args`` (what ``tupe-convert-hf`` restores).
"""

from transformers import PretrainedConfig

# The position-encoding settings of the plugin's model flags and their defaults (no position encoding).
POSITION_DEFAULTS = dict(
    abs_pos="none", rel_pos="none", untied_pos="none", cls_reset="none", untied_proj_bias=False,
    rel_pos_buckets=32, rel_pos_max_distance=128, shaw_max_distance=64, shaw_keys_only=False,
    rotary="none", rotary_base=10000.0, rotary_scaling="none", rotary_scaling_factor=1.0,
    alibi_asymmetric=False, alibi_learned_slopes=False, kerple_param="clamped", sandwich_dim=128,
    sandwich_scale=1.0, sandwich_frequencies="one-based", fire_hidden=32, fire_threshold=512.0,
    fire_signed=False, fire_normaliser="largest-distance", deberta_max_distance=512, deberta_buckets=0,
    deberta_share_att_key=False, deberta_p2c="released", deberta_rel_proj_bias="query",
    deberta_table_norm=False, deberta_emd=False, deberta_emd_layers=2,
)


class TupeConfig(PretrainedConfig):
    model_type = "tupe"

    def __init__(self, vocab_size=64, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=512, max_position_embeddings=512, hidden_act="gelu",
                 pooler_activation="tanh", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                 activation_dropout=0.0, classifier_dropout=0.0, layer_norm_eps=1e-5, pre_layer_norm=False,
                 embedding_layer_norm=True, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                 fairseq_model_args=None, **kwargs):
        positions = {name: kwargs.pop(name, default) for name, default in POSITION_DEFAULTS.items()}
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         **kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.hidden_act = hidden_act
        self.pooler_activation = pooler_activation
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.activation_dropout = activation_dropout
        self.classifier_dropout = classifier_dropout
        self.layer_norm_eps = layer_norm_eps
        self.pre_layer_norm = pre_layer_norm
        self.embedding_layer_norm = embedding_layer_norm
        self.fairseq_model_args = fairseq_model_args or {}
        for name, value in positions.items():
            setattr(self, name, value)
