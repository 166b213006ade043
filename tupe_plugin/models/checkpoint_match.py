"""Refuse, with a message a user can act on, a checkpoint whose weights do not fit the model being built.

fairseq wraps any ``load_state_dict`` failure of ``--restore-file`` into "please ensure that the
architectures match", with torch's list of size mismatches underneath. Fine-tuning from a masked-LM
checkpoint goes wrong in two ways that deserve their own words: a task prepared with another dictionary
than the pre-training one (embedding rows differ), and an ``--arch`` other than the pre-training one.
"""

HEAD_PREFIXES = ("classification_heads.", "span_heads.")


def check_checkpoint_matches(model_state, saved_state, prefix, arch):
    """Raise ``ValueError`` when ``saved_state`` lacks weights of ``model_state`` or has other shapes.

    Heads are left out: fine-tuning adds them. Extra weights in the checkpoint are fairseq's business
    (``--encoder-layers-to-keep`` prunes them after this check).
    """
    missing, resized = [], []
    for key, value in model_state.items():
        if key.startswith(HEAD_PREFIXES):
            continue
        saved = saved_state.get(prefix + key)
        if saved is None:
            missing.append(key)
        elif saved.shape != value.shape and not _position_table_of_another_length(key, saved, value):
            resized.append((key, tuple(saved.shape), tuple(value.shape)))
    embedding = next((r for r in resized if r[0].endswith("embed_tokens.weight") and r[1][1:] == r[2][1:]),
                     None)
    if embedding is not None:
        raise ValueError(
            f"the checkpoint's vocabulary has {embedding[1][0]} symbols but this model's dictionary has "
            f"{embedding[2][0]}: the data were binarized with another dict.txt; binarize them against "
            "the pre-training one (fairseq-preprocess --srcdict PRETRAIN-DATA/dict.txt; "
            "scripts/prepare_glue.py / scripts/prepare_squad.py --dict PRETRAIN-DATA/dict.txt)"
        )
    if missing or resized:
        details = [f"missing {key}" for key in missing[:3]]
        details += [f"{key} is {saved} in the checkpoint, {built} in the model"
                    for key, saved, built in resized[:3]]
        raise ValueError(
            f"the checkpoint does not fit --arch {arch} ({'; '.join(details)}"
            f"{', ...' if len(missing) + len(resized) > 3 else ''}): fine-tune with the --arch (and size "
            "flags) the checkpoint was pre-trained with; it is stored in the checkpoint's cfg.model.arch"
        )


def _position_table_of_another_length(key, saved, built):
    """Left to the model's own check, which names --max-positions."""
    return key.endswith("embed_positions.weight") and saved.shape[1:] == built.shape[1:]
