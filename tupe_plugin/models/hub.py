"""A plugin checkpoint loaded as RoBERTa's hub object (``encode``, ``extract_features``, ``predict``,
``fill_mask``).

The sentencepiece model is ``sentencepiece_model=`` or a ``sentencepiece.bpe.model`` next to the
checkpoint or in the data directory (``data_name_or_path``, holding ``dict.txt``).
"""

import os

from fairseq import hub_utils, utils
from fairseq.models.roberta.hub_interface import RobertaHubInterface

from ..fairseq_fixes.checkpoint_paths import check_checkpoints_in

MASK = "<mask>"


class TupeHubInterface(RobertaHubInterface):
    """RoBERTa's hub object with ``fill_mask`` reading each predicted token's own probability."""

    def fill_mask(self, masked_input, topk=5):
        """The ``topk`` most probable tokens at the one ``<mask>`` of ``masked_input``, most probable first,
        each as (the input with the token in place of ``<mask>``, its probability, the token).

        fairseq's ``fill_mask`` joins the ``topk`` ids into one string with ``Dictionary.string``, which
        leaves out ``<s>`` and ``</s>``, and reads the probabilities by position in that string: with
        ``</s>`` among the ``topk``, every later token got its neighbour's probability and ``topk - 1``
        results came back. Here each id is looked up on its own."""
        if masked_input.count(MASK) != 1:
            raise ValueError(f"fill_mask takes a text with exactly one {MASK} (e.g. 'He is a {MASK} guy'), "
                             f"got {masked_input.count(MASK)}")
        dictionary = self.task.source_dictionary
        pieces = f" {MASK} ".join(self.bpe.encode(span.rstrip()) for span in masked_input.split(MASK))
        tokens = dictionary.encode_line(f"<s> {pieces.strip()} </s>", append_eos=False,
                                        add_if_not_exist=False).long()
        at_mask = int((tokens == self.task.mask_idx).nonzero()[0, 0])
        with utils.model_eval(self.model):
            logits = self.model(tokens[None].to(device=self.device), features_only=False,
                                return_all_hiddens=False)[0]
        probabilities, ids = logits[0, at_mask].softmax(dim=-1).topk(k=topk)
        replaced = f" {MASK}" if f" {MASK}" in masked_input else MASK
        filled = []
        for probability, index in zip(probabilities.tolist(), ids.tolist()):
            piece = dictionary[index]
            token = self.bpe.decode(piece)
            if piece.startswith("\u2581"):  # a piece that starts a word keeps the space before it
                token = " " + token
            filled.append((masked_input.replace(replaced, token), probability, token))
        return filled

SENTENCEPIECE_MODEL = "sentencepiece.bpe.model"


def from_pretrained(model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".",
                    bpe="sentencepiece", archive_map=None, **kwargs):
    """The hub object of a checkpoint, in eval mode (no dropout: the same input gives the same
    features); call ``.train()`` on it to fine-tune."""
    if isinstance(model_name_or_path, str) and os.path.isdir(model_name_or_path):
        check_checkpoints_in(model_name_or_path, checkpoint_file)
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
    hub = TupeHubInterface(loaded["args"], loaded["task"], loaded["models"][0])
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
