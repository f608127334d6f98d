"""Names a package serves from its submodules on first access (PEP 562), so
importing a package stays light and a package's public names live in the
module that defines them.

>>> __getattr__, __dir__ = lazy_exports(__name__, {"load_llm": "rcn_fast.llm.load"})  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's module-level ``__getattr__`` and ``__dir__``.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    exports : Mapping[str, str]
        Public name -> the module that defines it under the same name.

    Returns
    -------
    (__getattr__, __dir__)
        ``__getattr__(name)`` imports the defining module and returns its
        attribute (not cached: a test that patches the defining module is
        seen); an unknown name is an ``AttributeError`` naming the package.
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
