"""fairseq --user-dir plugin: the position encodings of TUPE (Ke, He, Liu, "Rethinking Positional
Encoding in Language Pre-training", arXiv 2006.15595), of Wang et al. ("On Position Embeddings in
BERT", ICLR 2021) and the embedding initialisation of Kang et al. ("On Initializing Transformers
with Pre-trained Embeddings", arXiv 2407.12514)."""

from . import fairseq_fixes, policies  # noqa: F401  (fixes for every model; policies for the plugin's own)
from .user_input.user_errors import install as _print_user_errors_in_one_line
from . import criterions, models, tasks  # noqa: F401  (register criterions, the model and --arch presets, tasks)
from . import former_paths  # noqa: F401  (the former root modules' paths: tupe_plugin.user_errors, ...)

_print_user_errors_in_one_line(keeps_tracebacks=policies.scope.in_other_models_run)
