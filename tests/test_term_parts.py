"""The positional term as typed parts: one part of a kind, the parts each attention path reads, refused once
a forward in words where the path does not read one; and an encoding of a table each layer projects
(Transformer-XL's, one module under encodings/ that changes nothing in attention/ or encoder/) running on
every path through the layer and the encoder, its per-layer projection built by the layer from the
encoding."""

import pytest
import torch
import torch.nn.functional as F
from conftest import PRESETS, assert_gradients_close, build_model, features_and_grads, random_tokens
from paper_equations import xl_sinusoid

from tupe_plugin.attention.paths import PATH_READS, AttentionPath, AttentionPlan
from tupe_plugin.encoder.self_attention import PositionalSelfAttention
from tupe_plugin.encodings.position_config import PositionConfig
from tupe_plugin.encodings.positional_term import PositionalTerm, SharedPositionalTerm
from tupe_plugin.encodings.transformer_xl_position import RelativeKeyProjection
from tupe_plugin.terms.parts import (PART_TYPES, ClippedTable, DenseBias, LayerTerm, LowRank, OffsetRows,
                                     ProjectedTable, Rotary, Shift)

pytestmark = pytest.mark.smoke


def xl_reference(attention, xl, x, lengths, scale):
    """The layer's output by Transformer-XL's formula, (q_i + u) . k_j + (q_i + v) . W_R R_(i-j), with R of
    every pair written out."""
    batch, seq_len, embed_dim = x.shape
    heads, head_dim = attention.num_heads, attention.head_dim
    q, k, v = attention.project(x)
    relative = torch.stack([xl_sinusoid(i - j, embed_dim) for i in range(seq_len) for j in range(seq_len)])
    key_rows = attention.relative_projections.key(relative).view(seq_len, seq_len, heads, head_dim)
    u, v_bias = xl.content_bias[:, None], xl.position_bias[:, None]
    logits = scale * ((q + u) @ k.transpose(-1, -2) + torch.einsum("bhid,ijhd->bhij", q + v_bias, key_rows))
    padded = torch.arange(seq_len)[None, :] >= lengths[:, None]
    logits = logits.masked_fill(padded[:, None, None, :], torch.finfo(logits.dtype).min)
    out = torch.softmax(logits, -1) @ v
    return attention.out_proj(out.transpose(1, 2).reshape(batch, seq_len, embed_dim))


CONFIG = PositionConfig(embed_dim=32, num_heads=2, max_positions=16, rel_pos="xl")
PLANS = {
    "explicit": AttentionPlan(AttentionPath.EXPLICIT),
    "sdpa": AttentionPlan(AttentionPath.SDPA),
    "chunked": AttentionPlan(AttentionPath.CHUNKED, offset_bias_as_rows=True),
    "biased-flash": AttentionPlan(AttentionPath.BIASED_FLASH, offset_bias_as_rows=True),
    "triton": AttentionPlan(AttentionPath.TRITON, offset_bias_as_rows=True),
    "flex": AttentionPlan(AttentionPath.FLEX, offset_bias_as_rows=True),
}


@pytest.mark.parametrize("path", sorted(PLANS))
def test_a_projected_table_encoding_runs_through_the_layer_on_every_path_that_reads_it(path):
    plan = PLANS[path]
    torch.manual_seed(1)
    shared = SharedPositionalTerm(CONFIG)
    xl = shared.transformer_xl
    with torch.no_grad():
        xl.content_bias.normal_(std=0.5)
        xl.position_bias.normal_(std=0.5)
    attention = PositionalSelfAttention(CONFIG.embed_dim, CONFIG.num_heads, shared.layer_projection)
    assert isinstance(attention.relative_projections, RelativeKeyProjection)
    x = torch.randn(3, 7, CONFIG.embed_dim, requires_grad=True)
    lengths = torch.tensor([7, 5, 2])
    padding = torch.arange(7)[None, :] >= lengths[:, None]
    grad_enabled = path != "flex"  # FlexAttention has no CPU backward
    with torch.set_grad_enabled(grad_enabled):
        term = shared.build(7, plan.fold_untied, padding, x.dtype, plan.padding_as_lengths,
                            plan.offset_bias_as_rows)
        plan.check_reads(term.parts())
        out, _ = attention(x, term, plan)
        expected = xl_reference(attention, xl, x, lengths, term.scale)
    keep = ~padding[..., None]  # padded rows are not compared (their output is unused)
    torch.testing.assert_close(out * keep, expected * keep, atol=2e-5, rtol=2e-5)
    if grad_enabled:
        weights = torch.randn_like(out) * keep
        parameters = [x, xl.content_bias, xl.position_bias, attention.relative_projections.key.weight]
        actual = torch.autograd.grad((out * weights).sum(), parameters, retain_graph=True)
        wanted = torch.autograd.grad((expected * weights).sum(), parameters)
        for got, want in zip(actual, wanted):
            torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-4)


@pytest.mark.parametrize("backend", ["triton", "flex"])
def test_a_projected_table_model_gives_the_same_features_on_every_backend(backend, dictionary):
    model = build_model("bert_xl_tiny", dictionary).eval()
    names = [name for name, _ in model.named_parameters() if ".relative_projections." in name]
    assert len(names) == model.args.encoder_layers and all(".self_attn.relative_projections.key." in n
                                                           for n in names)
    other = build_model("bert_xl_tiny", dictionary, attention_backend=backend).eval()
    other.load_state_dict(model.state_dict())
    tokens = random_tokens(dictionary, [9, 6, 3])
    with torch.no_grad():
        explicit = model(tokens, features_only=True, need_attn=True)[0]  # the explicit path
        auto = model(tokens, features_only=True)[0]
        kernel = other(tokens, features_only=True)[0]
    keep = tokens.ne(dictionary.pad())[..., None]
    torch.testing.assert_close(auto * keep, explicit * keep, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(kernel * keep, explicit * keep, atol=2e-5, rtol=2e-5)


def test_a_projected_table_model_trains_the_same_on_the_triton_kernel_and_the_cpu_paths(dictionary):
    model = build_model("bert_xl_tiny", dictionary)
    triton = build_model("bert_xl_tiny", dictionary, attention_backend="triton")
    triton.load_state_dict(model.state_dict())
    tokens = random_tokens(dictionary, [9, 6, 3])
    keep = tokens.ne(dictionary.pad())[..., None]
    weights = torch.randn(*tokens.shape, model.args.encoder_embed_dim) * keep
    features, grads = features_and_grads(model, tokens, weights)
    kernel_features, kernel_grads = features_and_grads(triton, tokens, weights)
    torch.testing.assert_close(kernel_features * keep, features * keep, atol=2e-5, rtol=2e-5)
    assert_gradients_close(kernel_grads, grads)


# -- one part of a kind, and the parts each path reads


def _parts(heads=2, seq_len=4, dim=8, values=False, cls=False, query_shift=False):
    table = torch.zeros(2 * seq_len - 1, dim)
    offsets = torch.arange(2 * seq_len - 1)
    return {
        LowRank: LowRank(torch.zeros(heads, seq_len, 2), torch.zeros(heads, seq_len, 2)),
        Shift: Shift(torch.zeros(heads, seq_len, dim), torch.zeros(heads, seq_len, dim)),
        DenseBias: DenseBias(torch.zeros(heads, seq_len, seq_len)),
        OffsetRows: OffsetRows(torch.zeros(heads, 2 * seq_len - 1), torch.zeros(heads, 2) if cls else None),
        ClippedTable: ClippedTable(table, torch.zeros(seq_len, seq_len, dtype=torch.long), offsets, values),
        ProjectedTable: ProjectedTable(
            table, offsets, query_shift=torch.zeros(heads, 1, dim // heads) if query_shift else None),
        Rotary: Rotary(torch.ones(seq_len, dim // 2), torch.zeros(seq_len, dim // 2)),
        LayerTerm: LayerTerm("a layer's own term"),
    }


def test_a_term_holds_one_part_of_each_kind_listed_in_order():
    parts = _parts()
    term = PositionalTerm(scale=1.0)
    for kind in reversed(PART_TYPES):
        term.add(parts[kind])
    assert term.parts() == [parts[kind] for kind in PART_TYPES]
    with pytest.raises(ValueError, match="already holds a OffsetRows"):
        term.add(parts[OffsetRows])


def test_the_dense_form_leaves_out_a_query_only_shift():
    term = PositionalTerm(scale=0.5)
    term.add(Shift(torch.ones(2, 1, 4)))
    assert term.dense() is None
    term.add(DenseBias(torch.ones(2, 3, 3)))
    torch.testing.assert_close(term.dense(), torch.ones(2, 3, 3))


def test_every_path_reads_shifts_rotary_and_a_dense_bias_and_the_table_says_the_rest():
    assert all({"Shift", "Rotary", "DenseBias"} <= reads for reads in PATH_READS.values())
    assert {path for path, reads in PATH_READS.items() if "OffsetRows" in reads} == {
        AttentionPath.CHUNKED, AttentionPath.BIASED_FLASH, AttentionPath.TRITON, AttentionPath.FLEX}
    assert {path for path, reads in PATH_READS.items() if "ClippedTable.values" in reads} == {
        AttentionPath.EXPLICIT, AttentionPath.TRITON}
    assert "ProjectedTable" not in PATH_READS[AttentionPath.CUDNN_GRAPH]


@pytest.mark.parametrize("path, kinds, message", [
    (AttentionPath.SDPA, (OffsetRows,),
     r"path sdpa does not read a bias of the offset j - i as its rows \(OffsetRows\).*read them all: "
     r"chunked, biased-flash, triton, flex"),
    (AttentionPath.EXPLICIT, (DenseBias, OffsetRows), r"path explicit does not read a bias of the offset"),
    (AttentionPath.FLEX, (ClippedTable,),
     r"path flex does not read Shaw's value vectors.*: explicit, triton"),
    (AttentionPath.TRITON, (LowRank,), r"path triton does not read TUPE's untied factors"),
    (AttentionPath.CUDNN_GRAPH, (Shift, ProjectedTable),
     r"path cudnn-graph does not read a table each layer"),
    (AttentionPath.SDPA, (LowRank, OffsetRows, ClippedTable), r"no attention path reads them all together"),
])
def test_the_plan_refuses_a_part_its_path_does_not_read_naming_the_part_and_the_paths_that_do(path, kinds,
                                                                                            message):
    parts = _parts(values=True)
    with pytest.raises(ValueError, match=message):
        AttentionPlan(path).check_reads([parts[kind] for kind in kinds])


def test_the_plan_takes_every_part_its_path_reads():
    for path, reads in PATH_READS.items():
        parts = [part for part in _parts().values() if set(part.reads()) <= reads]
        AttentionPlan(path).check_reads(parts)


@pytest.mark.parametrize("path", [AttentionPath.TRITON, AttentionPath.FLEX])
def test_a_query_shift_beside_a_cls_reset_of_offset_rows_is_refused_where_it_joins_the_rows(path):
    parts = _parts(cls=True, query_shift=True)
    with pytest.raises(ValueError, match="query shift to the rows"):
        AttentionPlan(path).check_reads([parts[OffsetRows], parts[ProjectedTable]])
    AttentionPlan(AttentionPath.CHUNKED).check_reads([parts[OffsetRows], parts[ProjectedTable]])


def test_every_preset_builds_a_term_its_plan_reads(dictionary):
    """Each preset's forward passes the plan's check on the CPU paths it takes (training and evaluation)."""
    for preset in PRESETS:
        model = build_model(f"{preset}_tiny", dictionary)
        tokens = random_tokens(dictionary, [9, 4])
        model(tokens, features_only=True)
        with torch.no_grad():
            model.eval()(tokens, features_only=True, need_attn=True)


def test_a_layer_without_a_projection_of_its_own_projects_the_table_with_its_content_projections():
    attention = PositionalSelfAttention(8, 2)
    assert attention.relative_projections is None
    term = PositionalTerm(scale=1.0)
    term.add(ProjectedTable(torch.randn(5, 8), torch.arange(5)))
    query_rows, key_rows = attention._relative_rows(torch.float32, term)
    q, k = F.linear(term.get(ProjectedTable).table, attention.in_proj.weight[:16],
                    attention.in_proj.bias[:16]).split(8, -1)
    torch.testing.assert_close(key_rows, k.view(5, 2, 4).transpose(0, 1))
    torch.testing.assert_close(query_rows, q.view(5, 2, 4).transpose(0, 1))
