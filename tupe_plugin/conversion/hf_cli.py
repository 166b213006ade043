"""Convert a Hugging Face BERT, RoBERTa or DeBERTa (v1 to v3) masked LM into a plugin checkpoint.

    tupe-convert-hf --hf-model bert-base-uncased/ --out bert_a_base_hf [--arch tupe_r_base]

``--hf-model`` is a folder written by ``save_pretrained`` (``config.json``, ``model.safetensors`` or
``pytorch_model.bin``, and the tokenizer's ``vocab.txt``, or ``vocab.json`` + ``merges.txt`` (or their
vocabulary in ``tokenizer.json``), or DeBERTa-v2/v3's ``spm.model``). Writes ``OUT/model.pt``, a fairseq
checkpoint of the plugin's ``bert_a_*`` (BERT, RoBERTa) or ``deberta_*`` (DeBERTa) architecture of the
model's size computing what the original computes, ``OUT/dict.txt`` (the HF ids; [CLS] [PAD] [SEP] [UNK]
[MASK] become fairseq's <s> <pad> </s> <unk> <mask>) and the tokenizer files, recorded as the checkpoint's
fairseq ``--bpe`` (``bert``, ``hf_byte_bpe`` or ``sentencepiece``). fairseq-validate,
``TupeRobertaModel.from_pretrained(OUT, bpe=...)`` and fine-tuning (``--restore-file``) load it like any
plugin checkpoint. ``--arch`` another plugin architecture of the same size prints how to continue
pre-training with its position encoding swapped in. The conversion is :mod:`tupe_plugin.conversion.hf`
(BERT, RoBERTa) and :mod:`tupe_plugin.conversion.hf_deberta`.

Nothing is overwritten: the files are written beside OUT and moved into place when the conversion
succeeded; files of the same names already in OUT stop the conversion unless ``--force`` is given.
"""

import argparse
import logging
import sys

from tupe_plugin.conversion.hf_deberta import convert_any
from tupe_plugin.user_input.path_checks import path_problem
from tupe_plugin.user_input.user_errors import UserError


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf-model", required=True, help="the Hugging Face model folder (save_pretrained)")
    parser.add_argument("--out", required=True, help="folder for model.pt, dict.txt and the tokenizer files")
    parser.add_argument("--arch", help="a plugin architecture of the model's size to continue with (default: "
                        "the bert_a_* of its size); another position encoding is swapped in when training")
    parser.add_argument("--force", action="store_true",
                        help="replace the files already in --out (only once the conversion succeeded)")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
    if problem := path_problem(args.hf_model, "folder"):
        parser.error(f"--hf-model {args.hf_model}: {problem}: give the folder save_pretrained wrote")
    try:
        convert_any(args.hf_model, args.out, args.arch, args.force)
    except UserError as error:
        sys.exit(f"tupe-convert-hf: error: {error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
