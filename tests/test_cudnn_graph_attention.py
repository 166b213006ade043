"""``--attention-backend cudnn-graph``: cuDNN's fused attention built by the cuDNN frontend. On CPU: the plan
takes its path for the flag, with the untied term folded and padding as lengths; the refusals name the flag
and the fix (Shaw and DeBERTa terms, no frontend installed, CPU or float32 queries); no module of
the package imports ``cudnn`` when it is imported. On a GPU (``make test-gpu``; an ImportError of the
frontend there fails, it is not skipped): forward and gradients (q, k, v, the batch-summed bias) against the
float32 equation step by step (:func:`~tupe_plugin.attention.attend.explicit_attention`) within the fp16 /
bf16 tolerances of the Triton kernel's CUDA tests, key padding as lengths with a one-token row, dropout
under the keep-mask cuDNN drew, and models on the backend against the float32 explicit path."""

import ast
import sys
import types

import pytest
import torch
from conftest import build_model, make_dictionary, random_tokens
from package_imports import package_sources

from tupe_plugin.attention import cudnn_graph_attention, paths
from tupe_plugin.attention.attend import explicit_attention
from tupe_plugin.attention.cudnn_graph_attention import attention_and_keep_mask, cudnn_biased_attention
from tupe_plugin.encodings.position_config import PositionFlagError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# |half - float32| bounds of the Triton kernel's CUDA tests: the output, and each gradient relative to
# max(1, its largest entry)
OUTPUT_TOLERANCE = 0.05
GRADIENT_TOLERANCE = 0.06


@pytest.mark.parametrize("preset, overrides", [("bert_rpe", {"shaw_keys_only": True}), ("bert_rpe", {}),
                                               ("deberta", {})])
def test_the_cudnn_graph_backend_refuses_shaw_and_deberta_terms_naming_the_triton_backend(
        preset, overrides, dictionary):
    with pytest.raises(PositionFlagError, match="--attention-backend cudnn-graph takes one bias shared by "
                                                "the batch, .* use --attention-backend triton"):
        build_model(f"{preset}_tiny", dictionary, attention_backend="cudnn-graph", **overrides)


def test_on_cuda_without_the_cudnn_frontend_the_backend_names_the_package_to_install(dictionary, monkeypatch):
    monkeypatch.setattr(paths, "cudnn_frontend_installed", lambda: False)
    monkeypatch.setattr(paths.torch.cuda, "is_available", lambda: True)
    with pytest.raises(PositionFlagError, match="cudnn-graph needs the cuDNN frontend, which is not "
                                                "installed: pip install nvidia-cudnn-frontend"):
        build_model("tupe_r_tiny", dictionary, attention_backend="cudnn-graph")


def _half_inputs(dtype, device="cpu"):
    return [torch.zeros(1, 1, 4, 8, dtype=dtype, device=device) for _ in range(3)]


def test_queries_on_the_cpu_are_refused_naming_the_flag():
    with pytest.raises(RuntimeError, match="--attention-backend cudnn-graph needs a CUDA device"):
        cudnn_biased_attention(*_half_inputs(torch.bfloat16))


def test_float32_queries_are_refused_naming_the_half_precision_flags():
    with pytest.raises(RuntimeError, match="cudnn-graph runs cuDNN's fused attention in fp16 or bf16, and "
                                           "the queries are float32: train with --fp16, --bf16 or --amp"):
        cudnn_biased_attention(*_half_inputs(torch.float32))


def test_at_run_time_a_missing_frontend_names_the_package_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", None)  # import cudnn raises ImportError
    with pytest.raises(RuntimeError, match="cudnn-graph needs the cuDNN frontend: pip install "
                                           "nvidia-cudnn-frontend"):
        cudnn_graph_attention._cudnn()


def test_a_frontend_that_finds_no_cudnn_library_names_ld_library_path(monkeypatch):
    def no_library():
        raise RuntimeError("Unable to find symbol cudnnGetVersion")

    monkeypatch.setitem(sys.modules, "cudnn", types.SimpleNamespace(backend_version=no_library))
    with pytest.raises(RuntimeError, match="found no cuDNN library .* put its folder on LD_LIBRARY_PATH"):
        cudnn_graph_attention._cudnn()


def _imports_at_import_time(tree):
    """The modules a module's import statements outside functions name (what importing it imports)."""
    names, pending = [], list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.append(node.module)
        pending += list(ast.iter_child_nodes(node))
    return names


def test_importing_the_package_never_imports_the_cudnn_frontend():
    at_import = {module: _imports_at_import_time(ast.parse(source))
                 for module, source in package_sources().items()}
    assert any("torch" in names for names in at_import.values())  # the walk sees imports at all
    assert not {module for module, names in at_import.items()
                if any(name == "cudnn" or name.startswith("cudnn.") for name in names)}


def test_an_import_inside_a_function_is_not_one_at_import_time():
    tree = ast.parse("import torch\n\ndef run():\n    import cudnn\n")
    assert _imports_at_import_time(tree) == ["torch"]


# GPU: the graphs against the float32 equation


def _inputs(batch, heads, seq_len, head_dim, with_bias=True, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, generator=generator).cuda().requires_grad_()
               for _ in range(3))
    bias = torch.randn(1, heads, seq_len, seq_len, generator=generator).cuda().requires_grad_() if with_bias \
        else None
    return q, k, v, bias


def _mask(bias, lengths, batch, seq_len):
    """The bias with padded keys at float32's most negative value: the explicit path's additive mask."""
    if lengths is None:
        return bias
    padded = torch.arange(seq_len, device="cuda")[None, :] >= lengths[:, None]
    mask = torch.zeros(batch, 1, seq_len, seq_len, device="cuda") if bias is None \
        else bias.expand(batch, -1, -1, -1)
    return mask.masked_fill(padded[:, None, None, :], torch.finfo(torch.float32).min)


def _lengths(seq_len):
    return torch.tensor([seq_len, max(1, seq_len - 37), 5, 1], device="cuda")


def _assert_within_tolerances(out, expected, half, full, grad_out):
    """``out`` of the half-precision inputs ``half`` against the float32 ``expected`` of ``full``, and
    every gradient of the one against the other's."""
    assert torch.isfinite(out).all()
    assert (out.float() - expected).abs().max().item() <= OUTPUT_TOLERANCE
    wanted = [t for t in full if t is not None]
    given = [t for t in half if t is not None]
    for got, want in zip(torch.autograd.grad(out, given, grad_out.to(out.dtype)),
                         torch.autograd.grad(expected, wanted, grad_out)):
        assert torch.isfinite(got).all()
        bound = GRADIENT_TOLERANCE * max(1.0, want.abs().max().item())
        assert (got.float() - want).abs().max().item() <= bound


@pytest.mark.gpu
@pytest.mark.parametrize("seq_len", [128, 192, 512, 77])  # 192: T % 128 == 64; 77: no multiple of 8
@pytest.mark.parametrize("precision", sorted(DTYPES))
def test_with_a_bias_and_padding_the_graph_gives_the_float32_equation_and_its_gradients(precision, seq_len):
    q, k, v, bias = _inputs(4, 4, seq_len, 64)
    lengths = _lengths(seq_len)
    half = [t.detach().to(DTYPES[precision]).requires_grad_() for t in (q, k, v)]
    out = cudnn_biased_attention(*half, bias, lengths, scale=0.125)
    expected, _ = explicit_attention(q, k, v, _mask(bias, lengths, 4, seq_len), 0.125, 0.0)
    _assert_within_tolerances(out, expected, [*half, bias], [q, k, v, bias], torch.randn_like(expected))


@pytest.mark.gpu
@pytest.mark.parametrize("precision", sorted(DTYPES))
def test_without_bias_or_padding_the_graph_gives_the_float32_equation_and_its_gradients(precision):
    q, k, v, _ = _inputs(2, 4, 128, 64, with_bias=False)
    half = [t.detach().to(DTYPES[precision]).requires_grad_() for t in (q, k, v)]
    out = cudnn_biased_attention(*half)
    expected, _ = explicit_attention(q, k, v, None, 64 ** -0.5, 0.0)
    _assert_within_tolerances(out, expected, half, [q, k, v], torch.randn_like(expected))


@pytest.mark.gpu
@pytest.mark.parametrize("precision", sorted(DTYPES))
def test_with_dropout_the_graph_gives_the_float32_equation_under_its_keep_mask(precision):
    q, k, v, bias = _inputs(4, 4, 128, 64)
    lengths = _lengths(128)
    half = [t.detach().to(DTYPES[precision]).requires_grad_() for t in (q, k, v)]
    out, keep = attention_and_keep_mask(*half, bias, lengths, scale=0.125, dropout=0.2)
    _, probs = explicit_attention(q, k, v, _mask(bias, lengths, 4, 128), 0.125, 0.0)
    expected = (probs * keep / 0.8) @ v
    _assert_within_tolerances(out, expected, [*half, bias], [q, k, v, bias], torch.randn_like(expected))


@pytest.mark.gpu
def test_the_keep_mask_keeps_one_minus_the_dropout_of_the_probabilities():
    q, k, v, bias = (t.detach().half() for t in _inputs(2, 4, 256, 64))
    _, keep = attention_and_keep_mask(q, k, v, bias, dropout=0.25)
    assert set(keep.unique().tolist()) <= {0.0, 1.0}
    assert abs(keep.mean().item() - 0.75) < 0.01


@pytest.mark.gpu
def test_the_keep_mask_follows_torchs_cuda_generator():
    """The seed is drawn from torch's CUDA generator, which fairseq seeds every update: the same seed draws
    the same mask, the next draw another."""
    q, k, v, bias = (t.detach().half() for t in _inputs(1, 2, 64, 64))
    torch.manual_seed(3)
    first = attention_and_keep_mask(q, k, v, bias, dropout=0.5)[1]
    following = attention_and_keep_mask(q, k, v, bias, dropout=0.5)[1]
    torch.manual_seed(3)
    again = attention_and_keep_mask(q, k, v, bias, dropout=0.5)[1]
    assert torch.equal(first, again) and not torch.equal(first, following)


@pytest.mark.gpu
def test_padded_keys_take_no_attention_and_get_no_gradient():
    q, k, v, bias = (t.detach().bfloat16().requires_grad_() for t in _inputs(2, 2, 128, 64))
    lengths = torch.tensor([128, 11], device="cuda")
    out = cudnn_biased_attention(q, k, v, bias, lengths)
    with torch.no_grad():
        v_changed = v.clone()
        v_changed[1, :, 11:] += 100
    torch.testing.assert_close(cudnn_biased_attention(q, k, v_changed, bias, lengths)[1], out[1])
    grad_k, grad_v, grad_bias = torch.autograd.grad(out.float().sum(), (k, v, bias))
    assert not grad_k[1, :, 11:].any() and not grad_v[1, :, 11:].any()
    assert torch.isfinite(grad_bias).all()


@pytest.mark.gpu
def test_a_configuration_cudnn_has_no_kernel_for_is_refused_naming_the_flag_and_the_alternatives():
    q, k, v, bias = (t.detach().half() for t in _inputs(1, 2, 64, 12))  # head dim 12: not a multiple of 8
    with pytest.raises(RuntimeError, match=r"--attention-backend cudnn-graph: cuDNN has no forward kernel "
                                           r"for q \(1, 2, 64, 12\) in float16.*use --attention-backend "
                                           r"triton or auto"):
        cudnn_biased_attention(q, k, v, bias)


def _features_and_gradients(model, tokens, weights, context, need_attn=False):
    model.zero_grad()
    with context:
        features = model(tokens, features_only=True, need_attn=need_attn)[0]
    (features.float() * weights).sum().backward()
    return features.detach().float(), {name: p.grad.float() for name, p in model.named_parameters()
                                       if p.grad is not None}


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["tupe_r", "tupe_a", "bert_r", "bert_alibi", "bert_a"])
def test_a_model_on_the_cudnn_graph_backend_stays_within_bf16_tolerances_of_the_float32_explicit_path(preset):
    """Training mode without dropout, under bf16 autocast: features and every parameter's gradient (the
    learned biases' through dBias) against the float32 explicit path (need_attn), padded rows included."""
    torch.manual_seed(0)
    dictionary = make_dictionary()
    model = build_model(f"{preset}_tiny", dictionary, max_positions=128, attention_backend="cudnn-graph")
    model = model.cuda().train()
    tokens = random_tokens(dictionary, [128, 1, 40]).cuda()
    keep = tokens.ne(dictionary.pad()).unsqueeze(-1)
    weights = torch.randn(*tokens.shape, model.args.encoder_embed_dim, device="cuda") * keep
    bf16, float32 = torch.autocast("cuda", torch.bfloat16), torch.autocast("cuda", enabled=False)
    fused, fused_grads = _features_and_gradients(model, tokens, weights, bf16)
    plain, plain_grads = _features_and_gradients(model, tokens, weights, float32, need_attn=True)
    assert ((fused - plain) * keep).abs().max().item() <= 0.05
    assert set(fused_grads) == set(plain_grads)
    floor = 1e-3 * max(grad.norm().item() for grad in plain_grads.values())
    for name, grad in fused_grads.items():
        assert torch.isfinite(grad).all(), name
        bound = 0.06 * max(plain_grads[name].norm().item(), floor)
        assert (grad - plain_grads[name]).norm().item() <= bound, name
