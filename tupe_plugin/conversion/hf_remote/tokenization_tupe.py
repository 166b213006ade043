"""The tokenizer of a tupe-plugin export: the checkpoint's sentencepiece model and fairseq's dictionary order.

Self-contained (transformers and sentencepiece only); copied into an export whose ids no standard
``tokenizer.json`` can give (a piece of the sentencepiece model missing from the dictionary, ...). As
fairseq's RoBERTa hub encodes: the sentencepiece pieces of the text joined by spaces and split on
whitespace, each piece's id its line in ``vocab.txt`` (``<s> <pad> </s> <unk>``, the dictionary's
symbols, ``<mask>``), a piece outside it ``<unk>``; one text is ``<s> A </s>``, a pair ``<s> A </s> </s>
B </s>``.
"""

import os
import re
import shutil

import sentencepiece
from transformers import PreTrainedTokenizer

WHITESPACE = re.compile(r"\s+")


class TupeTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "vocab.txt", "sentencepiece_model_file": "sentencepiece.bpe.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, sentencepiece_model_file, bos_token="<s>", eos_token="</s>",
                 sep_token="</s>", cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>",
                 **kwargs):
        with open(vocab_file, encoding="utf-8") as f:
            self.symbols = [line.rstrip("\n") for line in f]
        # a repeated symbol has its last id, as in fairseq's Dictionary
        self.ids = {symbol: i for i, symbol in enumerate(self.symbols)}
        self.vocab_file, self.sentencepiece_model_file = vocab_file, sentencepiece_model_file
        self.processor = sentencepiece.SentencePieceProcessor(model_file=sentencepiece_model_file)
        super().__init__(bos_token=bos_token, eos_token=eos_token, sep_token=sep_token, cls_token=cls_token,
                         unk_token=unk_token, pad_token=pad_token, mask_token=mask_token, **kwargs)

    @property
    def vocab_size(self):
        return len(self.symbols)

    def get_vocab(self):
        return dict(self.ids)

    def _tokenize(self, text, **kwargs):
        pieces = " ".join(self.processor.encode(text, out_type=str))
        return WHITESPACE.sub(" ", pieces).strip().split()

    def _convert_token_to_id(self, token):
        return self.ids.get(token, self.ids[str(self.unk_token)])

    def _convert_id_to_token(self, index):
        return self.symbols[index]

    def convert_tokens_to_string(self, tokens):
        return self.processor.decode_pieces(list(tokens))

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        cls, sep = [self.cls_token_id], [self.sep_token_id]
        if token_ids_1 is None:
            return cls + token_ids_0 + sep
        return cls + token_ids_0 + sep + sep + token_ids_1 + sep

    def get_special_tokens_mask(self, token_ids_0, token_ids_1=None, already_has_special_tokens=False):
        if already_has_special_tokens:
            return super().get_special_tokens_mask(token_ids_0, token_ids_1, already_has_special_tokens=True)
        if token_ids_1 is None:
            return [1] + [0] * len(token_ids_0) + [1]
        return [1] + [0] * len(token_ids_0) + [1, 1] + [0] * len(token_ids_1) + [1]

    def create_token_type_ids_from_sequences(self, token_ids_0, token_ids_1=None):
        return [0] * len(self.build_inputs_with_special_tokens(token_ids_0, token_ids_1))

    def save_vocabulary(self, save_directory, filename_prefix=None):
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        saved = []
        for source, name in ((self.vocab_file, "vocab.txt"),
                             (self.sentencepiece_model_file, "sentencepiece.bpe.model")):
            target = os.path.join(save_directory, prefix + name)
            if os.path.abspath(source) != os.path.abspath(target):
                shutil.copyfile(source, target)
            saved.append(target)
        return tuple(saved)
