"""SQuAD span prediction: the prepared feature files (tupe-prepare-squad), span decoding, the official
EM/F1 and the evaluation of a checkpoint (tupe-evaluate-squad)."""
