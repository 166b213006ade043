"""A plugin checkpoint loaded as RoBERTa's hub object (``encode``, ``extract_features``, ``predict``).

The sentencepiece model is ``sentencepiece_model=`` or a ``sentencepiece.bpe.model`` next to the
checkpoint or in the data directory (``data_name_or_path``, holding ``dict.txt``).
"""

import os

from fairseq import hub_utils
from fairseq.models.roberta.hub_interface import RobertaHubInterface

SENTENCEPIECE_MODEL = "sentencepiece.bpe.model"


def from_pretrained(model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".",
                    bpe="sentencepiece", archive_map=None, **kwargs):
    """The hub object of a checkpoint, in eval mode (no dropout: the same input gives the same
    features); call ``.train()`` on it to fine-tune."""
    if bpe == "sentencepiece" and "sentencepiece_model" not in kwargs:
        kwargs["sentencepiece_model"] = find_sentencepiece_model(model_name_or_path, data_name_or_path)
    loaded = hub_utils.from_pretrained(
        model_name_or_path,
        checkpoint_file,
        data_name_or_path,
        archive_map=archive_map or {},
        bpe=bpe,
        load_checkpoint_heads=True,
        **kwargs,
    )
    hub = RobertaHubInterface(loaded["args"], loaded["task"], loaded["models"][0])
    return hub.eval()


def find_sentencepiece_model(model_dir, data_dir):
    """The sentencepiece model next to the checkpoint or in the data directory."""
    candidates = [os.path.join(model_dir, SENTENCEPIECE_MODEL)]
    if data_dir:
        candidates.append(os.path.join(model_dir, data_dir, SENTENCEPIECE_MODEL))
        candidates.append(os.path.join(data_dir, SENTENCEPIECE_MODEL))
    for path in candidates:
        if os.path.isfile(path):
            return os.path.abspath(path)
    raise FileNotFoundError(
        f"no {SENTENCEPIECE_MODEL} in {', '.join(candidates)}: pass sentencepiece_model=PATH "
        "(the model used to encode the pre-training data) or bpe=None to feed token ids"
    )
