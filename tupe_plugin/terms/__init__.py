"""The typed parts of the per-forward positional term (:mod:`.parts`): what an encoding adds to every layer's
attention (untied factors, query/key shifts, a dense bias, a bias of the offset j - i as its rows, Shaw's
clipped table, a table each layer projects, RoPE's tables), as the encodings build them and the attention
paths read them. Plain dataclasses of tensors, the one vocabulary both sides share.

May import torch only (and itself); never :mod:`tupe_plugin.encodings`, :mod:`tupe_plugin.attention` or
:mod:`tupe_plugin.encoder`, which all build on it.
"""
