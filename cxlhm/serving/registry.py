"""A registry per pluggable family (workloads, tiers, configurations), as in vidur:
implementations register under a name, callers look them up by the names users type."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownName(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


class Registry(Generic[T]):
    def __init__(self, family: str):
        self.family = family
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.family} {name!r} is registered twice")
            self._items[name] = item
            return item
        return add

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownName(f"unknown {self.family} {name!r}; known: {', '.join(self._items)}") from None

    def names(self) -> list[str]:
        return list(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
