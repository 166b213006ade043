"""Analysis of trained plugin models: position matrices, their property metrics, figures, reports.

Not imported by ``tupe_plugin`` itself (fairseq training never needs matplotlib); import
``tupe_plugin.analysis.<module>`` explicitly. docs/analysis.md defines every matrix and metric. The
commands: ``tupe-analyze`` (:mod:`.cli`) and ``tupe-export-embeddings`` (:mod:`.export_embeddings`).
"""
