"""Domain registry: name -> Domain instance. Recipes name domains by these keys."""

from __future__ import annotations

from stages.domains.base import Domain, Item, Split
from stages.domains.instruct import InstructDomain
from stages.domains.math import MathDomain

DOMAINS: dict[str, Domain] = {d.name: d for d in (MathDomain(), InstructDomain())}


def get_domain(name: str) -> Domain:
    try:
        return DOMAINS[name]
    except KeyError:
        raise KeyError(f"unknown domain {name!r}; known: {sorted(DOMAINS)}") from None


__all__ = ["DOMAINS", "Domain", "Item", "Split", "get_domain"]
