"""What a checkpoint was trained with: its configuration, read without its tensors
(:mod:`.checkpoint_config`), and its vocabulary, a dictionary's words and whether a sentencepiece model fits
it (:mod:`.vocabulary`).

May import :mod:`tupe_plugin.user_input` and :mod:`tupe_plugin.fairseq_fixes` (the one checkpoint reader);
never the model or the tools above it.
"""
