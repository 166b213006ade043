"""Checks of the model flags: values and combinations that make no sense fail at build time, naming them."""


class PositionFlagError(ValueError):
    """A position-encoding flag (or combination of flags) that cannot be built."""


def check_position_flags(args):
    errors = []
    embed_dim, heads = args.encoder_embed_dim, args.encoder_attention_heads
    if heads < 1 or embed_dim < 1 or embed_dim % heads:
        errors.append(
            f"--encoder-embed-dim {embed_dim} must be a positive multiple of "
            f"--encoder-attention-heads {heads}"
        )
    for flag in ("max_positions", "encoder_layers", "encoder_ffn_embed_dim"):
        if getattr(args, flag) < 1:
            errors.append(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    tokens_per_sample = getattr(args, "tokens_per_sample", None)
    if tokens_per_sample is not None and 0 < args.max_positions < tokens_per_sample:
        errors.append(
            f"--max-positions {args.max_positions} is below --tokens-per-sample {tokens_per_sample}: "
            "fairseq would silently drop every longer training block; raise --max-positions or lower "
            "--tokens-per-sample"
        )
    for flag in ("dropout", "attention_dropout", "activation_dropout"):
        if not 0 <= getattr(args, flag) < 1:
            errors.append(f"--{flag.replace('_', '-')} is a probability in [0, 1), got {getattr(args, flag)}")
    if args.abs_pos != "none" and args.untied_pos != "none":
        errors.append(
            f"--abs-pos {args.abs_pos} adds positions to the input while --untied-pos "
            f"{args.untied_pos} models them in attention; choose one absolute encoding "
            "(TUPE: --abs-pos none --untied-pos tupe; BERT-A: --abs-pos learned --untied-pos none)"
        )
    if args.cls_reset != "none" and args.untied_pos != "tupe":
        errors.append(
            f"--cls-reset {args.cls_reset} needs --untied-pos tupe: theta_1/theta_2 are built "
            "with TUPE's U^Q/U^K (seed 001 §3.3)"
        )
    if args.untied_proj_bias and args.untied_pos == "none":
        errors.append(
            "--untied-proj-bias gives U^Q/U^K a bias but --untied-pos none has no U^Q/U^K; "
            "use it with --untied-pos tupe (or four-term)"
        )
    if args.rel_pos == "t5":
        buckets, distance = args.rel_pos_buckets, args.rel_pos_max_distance
        if buckets < 4 or buckets % 2:
            errors.append(f"--rel-pos-buckets must be even and >= 4, got {buckets}")
        elif distance <= buckets // 4:
            errors.append(
                f"--rel-pos-max-distance ({distance}) must exceed the exact-distance buckets "
                f"per direction (--rel-pos-buckets / 4 = {buckets // 4})"
            )
    if args.rel_pos.startswith("shaw-") and args.shaw_max_distance < 1:
        errors.append(f"--shaw-max-distance must be >= 1, got {args.shaw_max_distance}")
    head_dim = embed_dim // heads if heads >= 1 else 0
    if "sinusoidal" in args.rel_pos and head_dim % 2:
        errors.append(f"--rel-pos {args.rel_pos} needs an even head dimension, got {head_dim}")
    if "sinusoidal" in args.abs_pos and embed_dim % 2:
        errors.append(f"--abs-pos {args.abs_pos} needs an even --encoder-embed-dim, got {embed_dim}")
    if errors:
        raise PositionFlagError("invalid model flags:\n  " + "\n  ".join(errors))
