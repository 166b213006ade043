"""What fine-tuning on the downstream tasks shares (tupe-finetune-glue, tupe-finetune-squad): TUPE's
settings, the schedule and the fairseq-train run (:mod:`.finetuning`), and the run's ``run.json``
(:mod:`.run_record`).

May import :mod:`tupe_plugin.user_input`, :mod:`tupe_plugin.cli` and :mod:`tupe_plugin.checkpoints`;
never :mod:`tupe_plugin.glue` or :mod:`tupe_plugin.squad`, which build on it.
"""
