"""Triton kernels of rcn_fast, installed as ``rcn_fast.kernels``.

Kernel bodies live in modules of this package; their launchers (the code
that checks inputs, picks a grid and calls them) live beside the component
that uses them. Importing this package never imports triton: each kernel
module does that itself, lazily.
"""

__all__: list[str] = []
