"""Let ``torch.load(weights_only=True)`` (the default since torch 2.6) read fairseq checkpoints."""

import argparse

import torch

torch.serialization.add_safe_globals([argparse.Namespace])
