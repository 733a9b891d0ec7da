"""Checkpoints: the tensor spec implied by a config, validation, reading and generation."""
