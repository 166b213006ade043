from . import squad_span  # noqa: F401  (registers --criterion squad_span)
