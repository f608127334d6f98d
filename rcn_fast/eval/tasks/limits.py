"""What one task file may cost: a YAML loader with an alias budget. A
small file cannot exhaust memory or time: each limit fails at once (the
readers name the file). The Jinja templates of a task file are rendered
through the one template door, :mod:`rcn_fast._templates` (an allowlist,
budgets of steps, time and sizes, a worker process under kernel limits),
whose limit error :class:`TaskLimitError` is.

YAML (:class:`BoundedLoader`, a ``yaml.SafeLoader``): anchors and aliases
are allowed, but everything the aliases repeat -- nodes plus scalar
characters, counted as if expanded -- is held to :data:`MAX_ALIAS_COST`
per file, and nesting to :data:`MAX_DEPTH` levels. A "billion laughs"
file (a few hundred bytes whose aliases expand to billions of nodes) is
refused while it is read, before anything is built from it.
"""

from __future__ import annotations

from typing import Any

import yaml

from rcn_fast._templates import TemplateLimitError

#: Nodes plus scalar characters that a task file's aliases may repeat in all.
MAX_ALIAS_COST = 100_000
#: Nesting depth of a task file's YAML (mappings and lists).
MAX_DEPTH = 100
#: A template of a task file exceeds a limit of :mod:`rcn_fast._templates` (the message says which).
TaskLimitError = TemplateLimitError


# ------------------------------------------------------------------ YAML
class BoundedYAMLError(yaml.MarkedYAMLError):
    """A YAML file exceeds :data:`MAX_ALIAS_COST` or :data:`MAX_DEPTH` (with its line)."""


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with an alias budget and a depth limit (module notes)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._alias_cost = 0
        self._depth = 0
        self._open: set[str] = set()  # anchors of the collections being composed

    def compose_sequence_node(self, anchor: Any) -> Any:
        return self._compose_open(anchor, super().compose_sequence_node)

    def compose_mapping_node(self, anchor: Any) -> Any:
        return self._compose_open(anchor, super().compose_mapping_node)

    def _compose_open(self, anchor: Any, compose: Any) -> Any:
        if anchor is None:
            return compose(anchor)
        self._open.add(anchor)
        try:
            return compose(anchor)
        finally:
            self._open.discard(anchor)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            if event.anchor in self._open:
                raise BoundedYAMLError(None, None, f"alias *{event.anchor} refers to a collection that holds it "
                                       "(a recursive structure)", event.start_mark)
            node = self.anchors.get(event.anchor)
            if node is not None:  # an undefined alias is the base class's error
                left = MAX_ALIAS_COST - self._alias_cost
                self._alias_cost += _expanded_size(node, left + 1)
                if self._alias_cost > MAX_ALIAS_COST:
                    raise BoundedYAMLError(None, None, f"its aliases repeat more than {MAX_ALIAS_COST:,} nodes and "
                                           "characters (a YAML alias bomb?); write the values out or use fewer "
                                           "aliases", event.start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise BoundedYAMLError(None, None, f"it nests more than {MAX_DEPTH} levels deep",
                                       self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _expanded_size(node: yaml.Node, limit: int) -> int:
    """Nodes plus scalar characters of ``node`` with its aliases expanded
    (``node`` holds no alias to itself: :class:`BoundedLoader` refuses
    those), counted up to ``limit`` (so the work is bounded too)."""
    total = 0
    stack: list[Any] = [node]
    while stack and total < limit:
        n = stack.pop()
        total += 1
        if isinstance(n, yaml.ScalarNode):
            total += len(n.value)
        else:
            for child in n.value:
                stack.extend(child if isinstance(child, tuple) else (child,))
    return total


def load_yaml(text: str, loader: type[yaml.SafeLoader] = BoundedLoader) -> Any:
    """``yaml.load`` with a :class:`BoundedLoader` (or a subclass); the
    limits raise :class:`BoundedYAMLError`, a ``yaml.YAMLError``."""
    if not issubclass(loader, BoundedLoader):
        raise TypeError(f"loader: expected a BoundedLoader subclass, got {loader.__name__}")
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise BoundedYAMLError(None, None, "it nests too deeply", None) from None


__all__ = ["TaskLimitError", "BoundedLoader", "BoundedYAMLError", "load_yaml", "MAX_ALIAS_COST", "MAX_DEPTH"]
