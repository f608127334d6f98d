"""LLM backends by spec prefix: ``load_llm("<prefix>:<rest>", **options)``
calls the loader registered for ``<prefix>`` with ``(rest, **options)``.

Built in: ``openai`` (:func:`rcn_fast.llm.openai.client.load_spec`) and ``vllm``
(:func:`rcn_fast.llm.backends.vllm_engine.load_spec`), imported when first used. A
new backend is one module with a loader, made known by either

* :func:`register_backend` (``register_backend("toy", load_toy)``) in the
  process that loads models, or
* an entry point in the ``rcn_fast.llm_backends`` group of an installed
  package (``toy = "my_pkg.toy_llm:load_toy"``), found when a spec's prefix
  is not registered, so ``python -m rcn_fast.eval --model toy:...`` works
  with no code of the caller's.

Specs without a registered prefix are model files, ``package:<module>``
or hub ids (the local backend, :mod:`rcn_fast.llm.load`).
"""

from __future__ import annotations

import importlib
import re
import threading
from typing import Any, Callable

#: ``loader(rest, **options) -> LLM``: the backend of ``"<prefix>:<rest>"``.
Loader = Callable[..., Any]
#: The entry-point group of backends shipped by other packages.
ENTRY_POINT_GROUP = "rcn_fast.llm_backends"
#: Prefixes that are not backends: ``package:<module>`` names a model shipped in a package.
RESERVED = frozenset({"package", "http", "https", "file"})
_PREFIX = re.compile(r"[a-z][a-z0-9_.-]+")

_BUILTIN: dict[str, str] = {
    "openai": "rcn_fast.llm.openai.client:load_spec",
    "vllm": "rcn_fast.llm.backends.vllm_engine:load_spec",
}
_loaders: dict[str, Loader | str] = dict(_BUILTIN)
_lock = threading.Lock()


def _check_prefix(prefix: Any) -> str:
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix) or prefix in RESERVED:
        raise ValueError(f"prefix: expected a lower-case name of 2+ characters ([a-z][a-z0-9_.-]+, not one of "
                         f"{sorted(RESERVED)}), without the ':'; got {prefix!r}")
    return prefix


def register_backend(prefix: str, loader: Loader | str, *, replace: bool = False) -> None:
    """Make ``load_llm("<prefix>:<rest>", **options)`` call ``loader(rest, **options)``.

    Parameters
    ----------
    prefix : str
        The spec prefix, without the colon (e.g. ``"toy"``).
    loader : callable or str
        ``loader(rest, **options) -> LLM``, or ``"module:function"`` naming
        it (imported when the prefix is first used).
    replace : bool
        Allow replacing a registered prefix (a built-in one included).

    Raises
    ------
    ValueError
        A malformed or reserved prefix, or one already registered (without
        ``replace``).
    TypeError
        ``loader`` is neither callable nor a ``"module:function"`` string.
    """
    _check_prefix(prefix)
    if not callable(loader) and not (isinstance(loader, str) and re.fullmatch(r"[\w.]+:\w+", loader)):
        raise TypeError(f"loader: expected a callable or 'module:function', got {loader!r}")
    with _lock:
        if prefix in _loaders and not replace:
            raise ValueError(f"prefix: {prefix!r} is already registered ({_loaders[prefix]!r}); pass replace=True")
        _loaders[prefix] = loader


def unregister_backend(prefix: str) -> None:
    """Forget ``prefix`` (a built-in one comes back as built in)."""
    with _lock:
        _loaders.pop(prefix, None)
        if prefix in _BUILTIN:
            _loaders[prefix] = _BUILTIN[prefix]


def backend_prefixes() -> list[str]:
    """The registered prefixes (entry points not yet used are not listed)."""
    with _lock:
        return sorted(_loaders)


def _import(target: str) -> Loader:
    module, _, name = target.partition(":")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise TypeError(f"backend loader {target!r} is not a callable")
    return fn


def _entry_point(prefix: str) -> str | None:
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == prefix:
            return ep.value
    return None


def find_backend(spec: str) -> tuple[Loader, str] | None:
    """The loader for ``spec``'s prefix and the rest of the spec, or None
    when the spec has no backend prefix (a model path or hub id)."""
    prefix, sep, rest = spec.partition(":")
    if not sep or not _PREFIX.fullmatch(prefix) or prefix in RESERVED:
        return None
    with _lock:
        loader = _loaders.get(prefix)
    if loader is None:
        loader = _entry_point(prefix)
        if loader is None:
            return None
    if isinstance(loader, str):
        loader = _import(loader)
    return loader, rest


__all__ = ["Loader", "ENTRY_POINT_GROUP", "RESERVED", "register_backend", "unregister_backend",
           "backend_prefixes", "find_backend"]
