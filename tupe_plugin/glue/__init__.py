"""GLUE fine-tuning data: the tasks encoded for fairseq (tupe-prepare-glue) and the dev scores of the
runs collected into a table (tupe-collect-glue)."""
