from . import squad_span  # noqa: F401  (registers --task squad_span)
