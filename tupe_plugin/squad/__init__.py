"""SQuAD span prediction: the prepared feature files, span decoding and the official EM/F1."""
