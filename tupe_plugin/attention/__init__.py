"""Attention kernels and the one decision of which runs: the plan of a forward (:mod:`.paths`), the kernels
(:mod:`.attend`, :mod:`.cpu_kernels`, the compiled backward of :mod:`.compiled_kernels`, the Triton kernels of
:mod:`.triton_bias_attention` and RoPE's fused rotation of q and k, :mod:`.triton_rotary`, cuDNN's fused
attention as a graph of the cuDNN frontend, :mod:`.cudnn_graph_attention`), attention dropout
and the sums by relative offset that Shaw vectors and DeBERTa need (:mod:`.clipped_distances`,
:mod:`.toeplitz_scores`; the forms the Triton kernel and FlexAttention read, :mod:`.relative_terms`).
Consumes tensors (and a position config's properties), never an encoding.

May import torch and the term's parts (:mod:`tupe_plugin.terms`) only (and itself); never
:mod:`tupe_plugin.encodings` or :mod:`tupe_plugin.encoder`.
"""
