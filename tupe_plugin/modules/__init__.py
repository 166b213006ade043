"""Position encodings and attention: plain torch modules, no fairseq registry code."""
