"""Pre-training data: the corpus split into train/valid/test (tupe-build-corpus) and the sentencepiece
model that encodes it (tupe-train-spm)."""
