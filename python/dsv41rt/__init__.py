"""dsv41rt: a serving runtime specialised for DeepSeek-V4.1 (and V4) models.

The C++ core (`libdsv41rt`, bound as `dsv41rt._core`) owns execution; this package is the thin
control plane: configs, checkpoints, the CLI.
"""

from __future__ import annotations

__version__ = "0.1.0"


def __getattr__(name: str):  # lazy: importing dsv41rt must not load the C++ core
    if name == "Runtime":
        from .runtime import Runtime

        return Runtime
    raise AttributeError(name)
