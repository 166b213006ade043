from .tupe_roberta import TupeRobertaEncoder, TupeRobertaModel  # noqa: F401
from . import architectures  # noqa: F401  (registers the named --arch presets)
