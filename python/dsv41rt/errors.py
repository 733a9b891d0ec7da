"""Exception types of the Python control plane.

Every error names the item that is wrong (config field, file, tensor) so a user can fix the input
without reading code.
"""

from __future__ import annotations


class Dsv41rtError(Exception):
    """Base class of every error raised on purpose by dsv41rt."""


class ConfigError(Dsv41rtError, ValueError):
    """A config.json (or preset) is malformed or breaks the model's schedule rules."""


class CheckpointError(Dsv41rtError, ValueError):
    """A checkpoint does not match its config, or its files are malformed."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems: list[str] = list(problems or [])
