"""Converters from other checkpoint formats into plugin checkpoints."""
