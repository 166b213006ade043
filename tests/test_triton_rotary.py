"""RoPE's fused Triton rotation of q and k against the paper's 2x2 blocks (Su et al., "RoFormer", arXiv
2104.09864, Eq. 34; tests/paper_equations.py): forward and gradients, several heads, lengths that are not a
multiple of the kernel's block, the scaled tables, half precision, and a model whose plan fuses the rotation
against the same model on torch's rotation. Without a GPU the kernel runs through Triton's interpreter
(TRITON_INTERPRET=1, which tests/conftest.py sets)."""

import dataclasses

import pytest
import torch
from conftest import assert_gradients_close, build_model, features_and_grads, random_tokens
from paper_equations import rotated

from tupe_plugin.attention import paths, triton_bias_attention
from tupe_plugin.attention.triton_rotary import rotate_projection
from tupe_plugin.encodings.position_config import PositionConfig
from tupe_plugin.encodings.rotary_position import build_rotary, rotate

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def config(heads, head_dim, scaling="none", rotary="fixed"):
    factor = 1.0 if scaling == "none" else 2.0
    return PositionConfig(embed_dim=heads * head_dim, num_heads=heads, max_positions=64, rotary=rotary,
                          rotary_scaling=scaling, rotary_scaling_factor=factor)


def projection_rows(batch, seq_len, heads, head_dim, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch * seq_len, 3 * heads * head_dim, generator=generator).to(DEVICE, dtype)


def twin(rows, batch, heads, head_dim, position_config, frequencies):
    """q and k of each head rotated by the paper's 2x2 blocks, position by position; v as it is."""
    parts = rows.view(batch, -1, 3, heads, head_dim)
    turned = [torch.stack([rotated(parts[:, :, part, h], position_config, frequencies)
                           for h in range(heads)], 2)
              for part in (0, 1)]
    return torch.stack([*turned, parts[:, :, 2]], 2).flatten(2).flatten(0, 1)


@pytest.mark.parametrize("batch, seq_len, heads, head_dim, scaling", [
    (2, 40, 3, 10, "none"), (3, 1, 2, 8, "linear"), (1, 7, 4, 16, "ntk")])
def test_the_kernel_rotates_q_and_k_as_the_paper_forward_and_backward(batch, seq_len, heads, head_dim,
                                                                      scaling):
    position_config = config(heads, head_dim, scaling)
    rotary = build_rotary(position_config).to(DEVICE)
    cos, sin = rotary(seq_len)
    frequencies = rotary.sinusoid.frequencies.cpu()
    leaf = projection_rows(batch, seq_len, heads, head_dim).requires_grad_()
    out = rotate_projection(leaf.clone(), cos, sin, heads)
    expected = twin(leaf.cpu(), batch, heads, head_dim, position_config, frequencies)
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)
    grad_out = torch.randn_like(out)
    got, = torch.autograd.grad(out, leaf, grad_out)
    want, = torch.autograd.grad(expected, leaf, grad_out.cpu())
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_in_half_precision_the_kernel_rounds_once_what_float32_rotates(dtype):
    batch, seq_len, heads, head_dim = 2, 9, 2, 8
    cos, sin = build_rotary(config(heads, head_dim)).to(DEVICE)(seq_len)
    leaf = projection_rows(batch, seq_len, heads, head_dim, dtype).requires_grad_()
    out = rotate_projection(leaf.clone(), cos.to(dtype), sin.to(dtype), heads)
    assert out.dtype == dtype

    def plain(rows):
        q, k, v = rows.float().view(batch, seq_len, 3, heads, head_dim).permute(2, 0, 3, 1, 4)  # (B, H, T, d)
        tables = cos.to(dtype).float(), sin.to(dtype).float()
        parts = torch.stack([rotate(q, *tables), rotate(k, *tables), v])
        return parts.permute(1, 3, 0, 2, 4).flatten(2).flatten(0, 1)

    torch.testing.assert_close(out, plain(leaf.detach()).to(dtype))
    grad_out = torch.randn_like(out)
    got, = torch.autograd.grad(out, leaf, grad_out)
    want, = torch.autograd.grad(plain(leaf), leaf, grad_out)
    torch.testing.assert_close(got, want)


def test_the_kernel_refuses_tables_that_take_a_gradient():
    cos, sin = build_rotary(config(2, 8, rotary="learnable")).to(DEVICE)(5)
    assert cos.requires_grad
    with pytest.raises(ValueError, match="learnable frequencies take the plain rotation"):
        rotate_projection(projection_rows(1, 5, 2, 8), cos, sin, 2)


def test_without_a_gpu_or_the_interpreter_the_kernel_says_what_it_needs(monkeypatch):
    monkeypatch.delenv(triton_bias_attention.INTERPRET, raising=False)
    cos, sin = build_rotary(config(2, 8))(5)
    with pytest.raises(RuntimeError, match="the fused RoPE kernel needs a CUDA device"):
        rotate_projection(torch.zeros(5, 48), cos, sin, 2)


@pytest.mark.parametrize("device, rotary, backend, fused", [
    ("cuda", "fixed", "triton", True), ("cpu", "fixed", "triton", False),
    ("cuda", "learnable", "triton", False), ("cuda", "none", "triton", False),
    ("cuda", "fixed", "auto", False), ("cuda", "fixed", "efficient", False)])
def test_the_plan_fuses_the_rotation_where_asked_on_cuda_for_fixed_frequencies_only(device, rotary, backend,
                                                                                     fused):
    """The fused rotation has not run on a GPU yet: --attention-backend triton asks for it, auto does not."""
    plan = paths.plan_attention(device, 0.1, False, config(2, 8, rotary=rotary), 16, backend)
    assert plan.fused_rotary is fused


def test_a_model_whose_plan_fuses_the_rotation_gives_torch_rotations_function_and_gradients(
        dictionary, monkeypatch):
    model = build_model("bert_rope_tiny", dictionary).to(DEVICE)
    tokens = random_tokens(dictionary, [11, 6, 3]).to(DEVICE)
    weights = torch.randn(*tokens.shape, model.args.encoder_embed_dim, device=DEVICE)
    original_plan, calls = paths.plan_attention, []

    def recording(rows, cos, sin, heads):
        calls.append(rows.shape)
        return rotate_projection(rows, cos, sin, heads)

    monkeypatch.setattr("tupe_plugin.encoder.self_attention.rotate_projection", recording)
    results = {}
    for fused in (False, True):
        def plan(*args, fused=fused):
            return dataclasses.replace(original_plan(*args), fused_rotary=fused)

        monkeypatch.setattr("tupe_plugin.encoder.positional_encoder.plan_attention", plan)
        results[fused] = features_and_grads(model, tokens, weights)
    assert calls == [(3 * 11, 3 * model.args.encoder_embed_dim)] * model.args.encoder_layers
    torch.testing.assert_close(results[True][0], results[False][0], atol=1e-5, rtol=1e-5)
    assert_gradients_close(results[True][1], results[False][1])
