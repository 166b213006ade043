"""A comparison of position encodings, from a corpus to the report, as one resumable command.

``tupe-study CONFIG.yaml --out DIR`` pre-trains each architecture of the config on one
corpus, fine-tunes it on GLUE tasks and SQuAD, analyses its positions, and writes
``DIR/report.md``, ``DIR/report.json`` and ``DIR/figures/`` side by side, the comparisons of TUPE
(Ke, He and Liu, arXiv 2006.15595, Table 2 and Fig. 4) and of "On Position Embeddings in BERT"
(Wang et al. 2021, Tables 2-3).

Every step is a job that runs command-line tools (fairseq-train, the package's commands such as
``python -m tupe_plugin.analysis.cli``, ``python -m tupe_plugin.glue.finetune``, ...) in its own folder:

- :mod:`.config`    the YAML config and its checks;
- :mod:`.jobs`      the jobs of a config, their commands and fingerprints;
- :mod:`.state`     what each job folder records (started, done, failed);
- :mod:`.launchers` running a job here (``local``) or through submitit (SLURM);
- :mod:`.runner`    the study loop: order, skipping, failures, progress;
- :mod:`.results`   the numbers of a finished study, read from the job folders' logs;
- :mod:`.report`    report.json and report.md;
- :mod:`.figures`   the loss curves and the analysis panels side by side;
- :mod:`.unigram`   the context-free baseline;
- :mod:`.squad_split` the deterministic train/dev split of SQuAD dev articles.
"""
