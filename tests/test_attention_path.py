"""One decision per forward picks the attention path; the untied term is folded exactly when that
path wants it, and every layer runs the path it was given."""

import argparse
import logging

import pytest
import torch
from conftest import assert_gradients_close, build_model, features_and_grads, random_tokens
from tupe_plugin.attention import attend, compiled_kernels, paths
from tupe_plugin.attention.paths import AttentionPath, choose_path, fold_untied_term
from tupe_plugin.encodings import position_config
from tupe_plugin.encodings.position_config import PositionConfig
from tupe_plugin.models.architectures import ARCHITECTURES

TUPE_R = PositionConfig(embed_dim=8, num_heads=2, max_positions=8, rel_pos="t5", untied_pos="tupe",
                        cls_reset="paper")
TUPE_A = PositionConfig(embed_dim=8, num_heads=2, max_positions=8, untied_pos="tupe", cls_reset="paper")
SHAW_VALUES = PositionConfig(embed_dim=8, num_heads=2, max_positions=8, rel_pos="shaw-learned")
ALIBI = PositionConfig(embed_dim=8, num_heads=2, max_positions=8, rel_pos="alibi")


LONG = 3 * TUPE_R.head_dim  # longer than the head dimension


@pytest.mark.parametrize("config, device, dropout, need_weights, expected", [
    (TUPE_A, "cpu", 0.0, False, AttentionPath.BIASED_FLASH),
    (TUPE_A, "cpu", 0.1, False, AttentionPath.CHUNKED),
    (TUPE_A, "cuda", 0.0, False, AttentionPath.SDPA),
    (TUPE_A, "cpu", 0.0, True, AttentionPath.EXPLICIT),
    (TUPE_R, "cpu", 0.0, False, AttentionPath.BIASED_FLASH),
    (TUPE_R, "cpu", 0.1, False, AttentionPath.CHUNKED),
    (TUPE_R, "cuda", 0.1, False, AttentionPath.SDPA),
    (TUPE_A, "cuda", 0.0, True, AttentionPath.EXPLICIT),
    (SHAW_VALUES, "cuda", 0.0, False, AttentionPath.EXPLICIT),
    (SHAW_VALUES, "cpu", 0.0, False, AttentionPath.EXPLICIT),
])
def test_the_path_follows_device_dropout_weights_and_value_terms(config, device, dropout, need_weights,
                                                                  expected):
    assert choose_path(device, dropout, need_weights, config, LONG) is expected


@pytest.mark.parametrize("config", [TUPE_R, TUPE_A], ids=["t5_bias", "untied_term_alone"])
@pytest.mark.parametrize("seq_len, expected", [
    (1, AttentionPath.EXPLICIT), (TUPE_R.head_dim, AttentionPath.EXPLICIT),
    (TUPE_R.head_dim + 1, AttentionPath.BIASED_FLASH), (2 * TUPE_R.head_dim, AttentionPath.BIASED_FLASH),
])
def test_a_learned_bias_without_dropout_takes_the_explicit_path_up_to_the_head_dim(config, seq_len, expected):
    assert choose_path("cpu", 0.0, False, config, seq_len) is expected


@pytest.mark.parametrize("config", [TUPE_R, TUPE_A], ids=["t5_bias", "untied_term_alone"])
def test_a_learned_bias_without_gradients_keeps_the_plain_fused_kernel(config):
    with torch.no_grad():
        assert choose_path("cpu", 0.0, False, config, LONG) is AttentionPath.SDPA


@pytest.mark.parametrize("seq_len, grad, dropout, expected", [
    (ALIBI.head_dim, True, 0.0, AttentionPath.SDPA),
    (ALIBI.head_dim + 1, True, 0.0, AttentionPath.BIASED_FLASH),
    (LONG, False, 0.0, AttentionPath.SDPA), (LONG, True, 0.1, AttentionPath.CHUNKED),
])
def test_a_fixed_distance_bias_in_training_past_the_head_dim_takes_the_biased_flash_path(
        seq_len, grad, dropout, expected):
    """SDPA's CPU backward would compute with ALiBi's subnormal probabilities (slow on Intel CPUs); the biased
    flash backward drops them. Without gradients SDPA's forward stays."""
    with torch.set_grad_enabled(grad):
        assert choose_path("cpu", dropout, False, ALIBI, seq_len) is expected


@pytest.mark.parametrize("path", list(AttentionPath))
def test_the_untied_term_is_folded_on_the_cpu_paths_of_their_own_and_beside_a_t5_bias(path):
    assert fold_untied_term(path, TUPE_R)
    assert fold_untied_term(path, TUPE_A) == (path is not AttentionPath.SDPA)


def _head_widths_on_explicit_path(model, dictionary, monkeypatch, **forward_kwargs):
    widths = []
    original = attend.explicit_attention

    def recording(q, *args, **kwargs):
        widths.append(q.size(-1))
        return original(q, *args, **kwargs)

    monkeypatch.setattr(attend, "explicit_attention", recording)
    model(random_tokens(dictionary, [7, 5]), features_only=True, **forward_kwargs)
    return widths


@pytest.mark.parametrize("preset", ["tupe_a", "tupe_a_tie_cls", "tupe_r"])
def test_attention_maps_run_the_explicit_path_on_heads_of_d_h(preset, dictionary, monkeypatch):
    model = build_model(f"{preset}_tiny", dictionary).eval()
    widths = _head_widths_on_explicit_path(model, dictionary, monkeypatch, need_attn=True)
    assert widths == [model.encoder.sentence_encoder.config.head_dim] * 2


def test_untied_term_with_shaw_values_runs_the_explicit_path_on_heads_of_d_h(dictionary, monkeypatch):
    model = build_model("tupe_a_tiny", dictionary, rel_pos="shaw-learned")
    widths = _head_widths_on_explicit_path(model, dictionary, monkeypatch)
    assert widths == [model.encoder.sentence_encoder.config.head_dim] * 2


@pytest.mark.parametrize("preset", ["tupe_a", "tupe_r", "bert_rpe"])
def test_attention_maps_do_not_change_the_features(preset, dictionary):
    model = build_model(f"{preset}_tiny", dictionary).eval()
    tokens = random_tokens(dictionary, [7, 5])
    with torch.no_grad():
        plain, _ = model(tokens, features_only=True)
        with_maps, extra = model(tokens, features_only=True, need_attn=True)
    torch.testing.assert_close(with_maps, plain, atol=1e-5, rtol=1e-5)
    assert len(extra["attn"]) == 2


@pytest.mark.parametrize("config, device, requested, expected", [
    (TUPE_R, "cuda", "auto", (torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION,
                              torch.nn.attention.SDPBackend.MATH)),
    (TUPE_A, "cuda", "auto", None),
    (TUPE_R, "cpu", "auto", None),
    (TUPE_A, "cuda", "cudnn", (torch.nn.attention.SDPBackend.CUDNN_ATTENTION,)),
    (TUPE_R, "cpu", "math", (torch.nn.attention.SDPBackend.MATH,)),
])
def test_a_learned_bias_on_cuda_takes_the_memory_efficient_kernel_with_math_behind_unless_another_is_asked(
        config, device, requested, expected):
    assert paths.sdpa_backends(device, config, requested) == expected


def _sdpa_calls(monkeypatch):
    """(mask dtype, query dtype, allowed backends) of every SDPA call."""
    calls = []
    original, kernel = attend.F.scaled_dot_product_attention, attend.sdpa_kernel

    def recording(q, k, v, attn_mask=None, **kwargs):
        mask = None if attn_mask is None else attn_mask.dtype
        calls.append((mask, q.dtype, allowed[-1] if allowed else None))
        return original(q, k, v, attn_mask=attn_mask, **kwargs)

    allowed = []

    def recording_kernel(backends):
        allowed.append(tuple(backends))
        return kernel(backends)

    monkeypatch.setattr(attend.F, "scaled_dot_product_attention", recording)
    monkeypatch.setattr(attend, "sdpa_kernel", recording_kernel)
    return calls


def test_under_autocast_the_mask_reaches_sdpa_in_the_querys_dtype(dictionary, monkeypatch):
    model = build_model("tupe_r_tiny", dictionary).eval()
    tokens = random_tokens(dictionary, [20, 15])
    calls = _sdpa_calls(monkeypatch)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        features = model(tokens, features_only=True)[0]
    assert calls and all(mask == q == torch.bfloat16 for mask, q, _ in calls)
    assert torch.isfinite(features).all()


def test_attention_backend_flag_reaches_every_layers_sdpa_call(dictionary, monkeypatch):
    model = build_model("tupe_r_tiny", dictionary, attention_backend="math").eval()
    calls = _sdpa_calls(monkeypatch)
    with torch.no_grad():
        model(random_tokens(dictionary, [20, 15]), features_only=True)
    assert len(calls) == 2 and all(backends == (torch.nn.attention.SDPBackend.MATH,)
                                   for _, _, backends in calls)


@pytest.mark.parametrize("preset, overrides", [("bert_a", {}), ("tupe_a", {}), ("tupe_r", {}),
                                               ("bert_alibi", {}), ("bert_rope", {}),
                                               ("bert_rpe", {"shaw_keys_only": True}), ("deberta", {})])
def test_training_with_attention_dropout_runs_the_chunked_path_as_the_explicit_one(
        preset, overrides, dictionary, monkeypatch):
    """Both paths draw one keep-mask of (B, H, T, T) a layer from the same generator: with the same seed
    the chunked kernel gives the explicit path's function and gradients."""
    model = build_model(f"{preset}_tiny", dictionary, attention_dropout=0.3, **overrides)
    tokens = random_tokens(dictionary, [7, 5, 3])
    weights = torch.randn(*tokens.shape, model.args.encoder_embed_dim)
    chosen = []
    recorded = paths.choose_path
    monkeypatch.setattr(paths, "choose_path", lambda *a: chosen.append(recorded(*a)) or chosen[-1])
    chunked, chunked_grads = features_and_grads(model, tokens, weights, seed=3)
    assert chosen == [AttentionPath.CHUNKED]
    monkeypatch.setattr(paths, "choose_path", lambda *a: AttentionPath.EXPLICIT)
    explicit, explicit_grads = features_and_grads(model, tokens, weights, seed=3)
    torch.testing.assert_close(chunked, explicit, atol=1e-5, rtol=1e-5)
    assert_gradients_close(chunked_grads, explicit_grads)


def _compiled_calls_as_the_explicit_path(model, lengths, dictionary, monkeypatch, record):
    """``record(args)`` of every compiled backward call of one training step without dropout, after checking
    that the step's features and gradients are the explicit path's."""
    tokens = random_tokens(dictionary, lengths)
    weights = torch.randn(*tokens.shape, model.args.encoder_embed_dim)
    compiled = compiled_kernels.biased_attention_backward()
    assert compiled is not None, "the compiled kernel did not build"
    calls = []
    monkeypatch.setattr(compiled_kernels, "biased_attention_backward",
                        lambda: lambda *a, **kw: calls.append(record(a)) or compiled(*a, **kw))
    fused, fused_grads = features_and_grads(model, tokens, weights)
    monkeypatch.setattr(paths, "choose_path", lambda *a: AttentionPath.EXPLICIT)
    explicit, explicit_grads = features_and_grads(model, tokens, weights)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)
    assert_gradients_close(fused_grads, explicit_grads)
    return calls


@pytest.mark.parametrize("preset, overrides", [("tupe_r", {}), ("tupe_a", {}), ("bert_r", {}),
                                               ("bert_rpe", {"shaw_keys_only": True})])
@pytest.mark.parametrize("lengths", [[75, 70, 40], [75, 75]], ids=["padded", "unpadded"])
def test_training_with_a_learned_bias_runs_the_compiled_backward_as_the_explicit_path(
        preset, overrides, lengths, dictionary, monkeypatch):
    """Without dropout, on CPU, past T = d_h: the flash forward and the compiled backward, every layer
    (with padding the mask is per batch row; without, the bias shared by the batch)."""
    model = build_model(f"{preset}_tiny", dictionary, max_positions=80, **overrides)
    calls = _compiled_calls_as_the_explicit_path(model, lengths, dictionary, monkeypatch,
                                                 lambda args: args[6])
    assert len(calls) == model.args.encoder_layers


@pytest.mark.parametrize("preset", ["bert_alibi", "bert_sandwich"])
@pytest.mark.parametrize("lengths", [[75, 70, 40], [75, 75]], ids=["padded", "unpadded"])
def test_training_with_a_fixed_bias_runs_the_compiled_backward_on_its_rows_as_the_explicit_path(
        preset, lengths, dictionary, monkeypatch):
    """Without dropout, on CPU, past T = d_h: the flash forward and the compiled backward, every layer, given
    the bias's rows (no dense mask: padding as a key bias) and asked for no gradient of them."""
    model = build_model(f"{preset}_tiny", dictionary, max_positions=80)
    calls = _compiled_calls_as_the_explicit_path(model, lengths, dictionary, monkeypatch,
                                                 lambda args: (args[6], args[9].shape, args[13]))
    rows = (model.args.encoder_attention_heads, 2 * max(lengths) - 1)
    assert calls == [(None, rows, False)] * model.args.encoder_layers


@pytest.mark.parametrize("config", [TUPE_A, TUPE_R, SHAW_VALUES])
@pytest.mark.parametrize("device, dropout", [("cpu", 0.0), ("cpu", 0.1), ("cuda", 0.0)])
def test_a_plan_carries_its_path_dropout_kernels_and_whether_the_untied_term_is_folded(
        config, device, dropout):
    plan = paths.plan_attention(device, dropout, False, config, LONG, "auto")
    assert plan.path is choose_path(device, dropout, False, config, LONG)
    assert plan.dropout == dropout
    assert plan.backends == paths.sdpa_backends(device, config, "auto")
    assert plan.fold_untied == fold_untied_term(plan.path, config)


def test_the_triton_backend_under_triton_interpret_on_a_cpu_says_the_interpreter_runs_its_kernel(
        dictionary, monkeypatch, caplog):
    """TRITON_INTERPRET=1 fairseq-train --attention-backend triton --cpu: the kernel runs, interpreted."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(paths.torch.cuda, "is_available", lambda: False)
    with caplog.at_level(logging.WARNING):
        model = build_model("tupe_r_tiny", dictionary, attention_backend="triton", attention_dropout=0.0)
    assert "--attention-backend triton with TRITON_INTERPRET=1 and no CUDA device: Triton's interpreter " \
        "runs the kernel on the CPU" in caplog.text
    assert "the CPU attention paths run in its place" not in caplog.text
    assert model.encoder.sentence_encoder.attention_plan("cpu", False, 64).path is AttentionPath.TRITON


@pytest.mark.parametrize("backend", ["flex", "cudnn-graph"])
def test_another_kernel_backend_under_triton_interpret_still_says_the_cpu_paths_run(backend, dictionary,
                                                                                    monkeypatch, caplog):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(paths, "cudnn_frontend_installed", lambda: False)
    monkeypatch.setattr(paths.torch.cuda, "is_available", lambda: False)
    with caplog.at_level(logging.WARNING):
        build_model("tupe_r_tiny", dictionary, attention_backend=backend, attention_dropout=0.0)
    assert f"--attention-backend {backend} names a CUDA kernel and torch sees no CUDA device: the CPU " \
        "attention paths run in its place" in caplog.text


@pytest.mark.parametrize("backend", ["triton", "flex", "cudnn-graph"])
def test_a_kernel_backend_without_a_cuda_device_runs_the_cpu_paths_in_its_place_with_a_warning(
        backend, dictionary, monkeypatch, caplog):
    """A model trained on a GPU with a kernel backend, evaluated or fine-tuned on a CPU machine."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(paths, "cudnn_frontend_installed", lambda: False)  # no package needed there
    monkeypatch.setattr(paths, "find_spec", lambda name: None)
    monkeypatch.setattr(paths.torch.cuda, "is_available", lambda: False)
    with caplog.at_level(logging.WARNING):
        model = build_model("tupe_r_tiny", dictionary, attention_backend=backend, attention_dropout=0.0)
    assert f"--attention-backend {backend} names a CUDA kernel and torch sees no CUDA device" in caplog.text
    encoder = model.encoder.sentence_encoder
    assert encoder.attention_plan("cpu", False, 64).path is AttentionPath.BIASED_FLASH
    twin = build_model("tupe_r_tiny", dictionary, attention_dropout=0.0)
    twin.load_state_dict(model.state_dict())
    tokens, weights = random_tokens(dictionary, [7, 5]), torch.tensor(0.7)
    features, grads = features_and_grads(model, tokens, weights)
    twin_features, twin_grads = features_and_grads(twin, tokens, weights)
    torch.testing.assert_close(features, twin_features)
    assert_gradients_close(grads, twin_grads)


def test_flex_runs_on_cpu_without_gradients_only():
    with torch.no_grad():
        assert paths.kernel_runs_on("flex", "cpu")
    assert not paths.kernel_runs_on("flex", "cpu")
    assert paths.kernel_runs_on("flex", "cuda")


TUPE_R_WITH_RESET = PositionConfig(embed_dim=8, num_heads=2, max_positions=8, rel_pos="t5", untied_pos="tupe",
                                   cls_reset="paper")


@pytest.mark.parametrize("backend, path, dropout, by_offset", [
    ("triton", AttentionPath.TRITON, 0.1, True), ("flex", AttentionPath.FLEX, 0.0, True),
    ("cudnn-graph", AttentionPath.CUDNN_GRAPH, 0.1, False)])
def test_a_kernel_backend_gets_its_path_with_the_untied_term_folded_and_padding_as_lengths(
        backend, path, dropout, by_offset):
    """The Triton kernel and FlexAttention read the relative terms and the distance bias by offset; cuDNN's
    graph takes the distance bias expanded into its one dense bias (and no relative terms)."""
    plan = paths.plan_attention("cuda", dropout, False, TUPE_R_WITH_RESET, 64, backend)
    assert plan.path is path and plan.padding_as_lengths and plan.fold_untied and plan.backends is None
    assert plan.relative_by_offset == by_offset and plan.offset_bias_as_rows == by_offset
    maps = paths.plan_attention("cuda", dropout, True, TUPE_R_WITH_RESET, 64, backend)
    assert maps.path is AttentionPath.EXPLICIT and not maps.padding_as_lengths


@pytest.mark.parametrize("path", [AttentionPath.SDPA, AttentionPath.CUDNN_GRAPH])
def test_attend_refuses_distance_rows_on_a_path_that_takes_one_dense_bias(path):
    q = k = v = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"take it expanded into the mask \(PositionalTerm.expanded\)"):
        attend.attend(path, q, k, v, None, 0.3, 0.0, offset_rows=torch.zeros(2, 7))


def _every_tiny_config():
    """The position config of every tiny preset."""
    configs = {}
    for arch in sorted(name for name in ARCHITECTURES if name.endswith("_tiny")):
        args = argparse.Namespace(max_positions=64)
        ARCHITECTURES[arch](args)
        position_config.set_defaults(args)
        configs[arch] = PositionConfig.from_args(args)
    return configs


@pytest.mark.parametrize("dropout, grad", [(0.1, True), (0.0, True), (0.0, False)])
def test_auto_on_a_cuda_device_takes_no_kernel_of_the_plugins_that_no_gpu_run_has_measured(
        monkeypatch, dropout, grad):
    """On a CUDA device (mocked: Triton and the cuDNN frontend installed), ``auto`` runs torch's operations
    and SDPA's kernels for every preset: no Triton attention or RoPE rotation, FlexAttention or cuDNN
    graph."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(paths, "find_spec", lambda name: object())
    monkeypatch.setattr(paths, "MEASURED_KERNELS", {})
    configs = _every_tiny_config()
    assert any(config.rotary_applies for config in configs.values())
    with torch.set_grad_enabled(grad):
        for arch, config in configs.items():
            for length in (8, 64):
                plan = paths.plan_attention("cuda", dropout, False, config, length, "auto")
                assert plan.path in (AttentionPath.SDPA, AttentionPath.EXPLICIT), arch
                assert not plan.fused_rotary, arch
                assert plan.backends is None or set(plan.backends) <= set(paths.SDPA_BACKENDS.values()), arch
                assert paths.backend_problem("auto", config, dropout) is None, arch
