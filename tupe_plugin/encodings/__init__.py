"""The position encodings, one module ``*_position.py`` each declaring every fact of its encoding
(:class:`~.encoding.Encoding`), the registry that finds them (:mod:`.registry`), their composed config
(:mod:`.position_config`) and the per-forward term they build together (:mod:`.positional_term`): what the
papers define, in plain torch.

May import torch, fairseq's modules, the term's parts (:mod:`tupe_plugin.terms`) and
:mod:`tupe_plugin.user_input` (user errors, command hints, argparse types, memory limits); never
:mod:`tupe_plugin.attention` or :mod:`tupe_plugin.encoder`, which build on it.
"""
