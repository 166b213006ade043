"""The encoder: its self-attention (the term of :mod:`tupe_plugin.encodings` run by the plan of
:mod:`tupe_plugin.attention`), layers, the stack, DeBERTa's Enhanced Mask Decoder, and the word embeddings'
initialisation from pre-trained vectors and its diagnosis.

May import :mod:`tupe_plugin.terms`, :mod:`tupe_plugin.encodings`, :mod:`tupe_plugin.attention`, fairseq and
torch; never the model, task or command-line code above it.
"""
