#!/usr/bin/env bash
# How the checkpoints in this folder were made (at commit c18212f, before tupe_plugin/modules was split into
# encodings/, attention/ and encoder/): one fairseq-train update of each architecture, shrunk to one layer
# of d 32 (4 heads), on the first 120 lines of WikiText-2 valid (tests/data/wikitext-2, CC BY-SA 3.0) with a
# 60-word dictionary; the optimizer state dropped; features.pt holds each model's features for fixed token
# ids, computed by the code that saved them. Run from the repository root with the virtualenv active.
set -euo pipefail
out=tests/data/checkpoints
work=$(mktemp -d)
head -120 tests/data/wikitext-2/wiki.valid.head.tokens > "$work/train.txt"
fairseq-preprocess --only-source --trainpref "$work/train.txt" --validpref "$work/train.txt" \
    --nwordssrc 60 --destdir "$work/bin" --workers 1 > /dev/null
cp "$work/bin/dict.txt" "$out/dict.txt"
for arch in tupe_r bert_a_lsin_rpe bert_lrope bert_alibi_asym bert_kerple bert_fire deberta_emd; do
    fairseq-train "$work/bin" --user-dir tupe_plugin --task masked_lm --criterion masked_lm --arch "${arch}_tiny" \
        --encoder-layers 1 --encoder-embed-dim 32 --encoder-ffn-embed-dim 64 --encoder-attention-heads 4 \
        --max-positions 32 --tokens-per-sample 32 --batch-size 4 --max-update 1 --optimizer adam --lr 1e-2 \
        --save-dir "$work/$arch" --cpu --seed 1 --no-epoch-checkpoints --no-last-checkpoints --num-workers 0 \
        --log-format simple > /dev/null
    python - "$work/$arch/checkpoint_best.pt" "$out/$arch.pt" <<'PY'
import sys, torch
state = torch.load(sys.argv[1], weights_only=False)
state["last_optimizer_state"] = None
torch.save(state, sys.argv[2])
PY
done
python - "$out" <<'PY'
import sys, torch
from fairseq import checkpoint_utils
import tupe_plugin  # noqa: F401  (registers the model; lets torch unpickle fairseq's configs)
out = sys.argv[1]
tokens = torch.tensor([[0, 5, 9, 14, 22, 7, 31, 2], [0, 11, 4, 2, 1, 1, 1, 1]])
features = {}
for arch in ["tupe_r", "bert_a_lsin_rpe", "bert_lrope", "bert_alibi_asym", "bert_kerple", "bert_fire", "deberta_emd"]:
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([f"{out}/{arch}.pt"], arg_overrides={"data": out})
    with torch.no_grad():
        features[arch] = models[0].eval()(tokens)[0]
torch.save({"tokens": tokens, "features": features}, f"{out}/features.pt")
PY
rm -rf "$work"
