"""Report section for Kang et al. §4: how much of the position signal the word embeddings leave.

Wraps :func:`tupe_plugin.encoder.embedding_diagnosis.embedding_position_diagnosis` (mean norms of
word and absolute position embeddings, their ratio, and the linear position probe) as a section of
the analysis report, so a checkpoint is diagnosed after training as the model build does before it.
"""

from ..encoder.embedding_diagnosis import embedding_position_diagnosis, format_diagnosis
from .report import SectionResult


def embeddings_vs_positions(context):
    name, title = "embeddings_vs_positions", "word vs position embedding scale (Kang et al.)"
    diagnosis = embedding_position_diagnosis(context.model, context.dictionary, seed=context.seed)
    if diagnosis["position_input"] == "none":
        return SectionResult.not_applicable(name, title, f"{context.arch}: {format_diagnosis(diagnosis)}")
    return SectionResult(name, title, metrics=diagnosis, summary=format_diagnosis(diagnosis))
