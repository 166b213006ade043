"""GLUE fine-tuning data: the table of the tasks (:mod:`.tasks`), the tasks encoded for fairseq
(tupe-prepare-glue) and the dev scores of the runs collected into a table (tupe-collect-glue)."""
