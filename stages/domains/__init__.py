"""Domain registry. Recipes name domains by these keys; a domain's module is imported on first use."""

from __future__ import annotations

import importlib

from stages.domains.base import Domain, Item, Split

DOMAIN_CLASSES: dict[str, str] = {
    "math": "stages.domains.math:MathDomain",
    "instruct": "stages.domains.instruct:InstructDomain",
    "code": "stages.domains.code:CodeDomain",
    "mcqa": "stages.domains.mcqa:MCQADomain",
    "structured": "stages.domains.structured:StructuredDomain",
    "tool": "stages.domains.tool:ToolDomain",
    "longctx": "stages.domains.longctx:LongContextDomain",
    "swe": "stages.domains.swe:SWEDomain",
    "chat": "stages.domains.chat:ChatDomain",
}
_instances: dict[str, Domain] = {}


def domain_names() -> list[str]:
    return sorted(set(DOMAIN_CLASSES) | set(_instances))


def register_domain(domain: Domain) -> None:
    """Add (or replace) a domain instance, e.g. a user's own or a test's."""
    _instances[domain.name] = domain


def unregister_domain(name: str) -> None:
    _instances.pop(name, None)


def get_domain(name: str) -> Domain:
    if name not in _instances:
        if name not in DOMAIN_CLASSES:
            raise KeyError(f"unknown domain {name!r}; known: {domain_names()}")
        module, cls = DOMAIN_CLASSES[name].split(":")
        _instances[name] = getattr(importlib.import_module(module), cls)()
    return _instances[name]


__all__ = ["DOMAIN_CLASSES", "Domain", "Item", "Split", "domain_names", "get_domain", "register_domain"]
