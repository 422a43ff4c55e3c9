"""Domain registry. Recipes name domains by these keys; a domain's module is imported on first use."""

from __future__ import annotations

import importlib

from cascade.stages.domains.base import Domain, Item, Split

DOMAIN_CLASSES: dict[str, str] = {
    "math": "cascade.stages.domains.math:MathDomain",
    "instruct": "cascade.stages.domains.instruct:InstructDomain",
    "code": "cascade.stages.domains.code:CodeDomain",
    "mcqa": "cascade.stages.domains.mcqa:MCQADomain",
    "structured": "cascade.stages.domains.structured:StructuredDomain",
    "tool": "cascade.stages.domains.tool:ToolDomain",
    "longctx": "cascade.stages.domains.longctx:LongContextDomain",
    "swe": "cascade.stages.domains.swe:SWEDomain",
    "chat": "cascade.stages.domains.chat:ChatDomain",
}
_instances: dict[str, Domain] = {}
_configured: dict[tuple[str, tuple], Domain] = {}  # (name, options) -> a domain built with constructor options


def domain_names() -> list[str]:
    return sorted(set(DOMAIN_CLASSES) | set(_instances))


def register_domain(domain: Domain) -> None:
    """Add (or replace) a domain instance, e.g. a user's own or a test's."""
    _instances[domain.name] = domain


def unregister_domain(name: str) -> None:
    _instances.pop(name, None)


def get_domain(name: str, options: dict | None = None) -> Domain:
    """The domain `name`; with options (a recipe's `domains.<name>.options`), one built with those keyword
    arguments, e.g. the long-context haystack's size. Grading reads only an item's meta, so any instance of a
    domain grades its items alike."""
    if options:
        key = (name, tuple(sorted(options.items())))
        if key not in _configured:
            if name not in DOMAIN_CLASSES:
                raise ValueError(f"domain {name!r} takes no options")
            module, cls = DOMAIN_CLASSES[name].split(":")
            try:
                _configured[key] = getattr(importlib.import_module(module), cls)(**options)
            except TypeError as e:
                raise ValueError(f"domains.{name}.options: {e}") from None
        return _configured[key]
    if name not in _instances:
        if name not in DOMAIN_CLASSES:
            raise KeyError(f"unknown domain {name!r}; known: {domain_names()}")
        module, cls = DOMAIN_CLASSES[name].split(":")
        _instances[name] = getattr(importlib.import_module(module), cls)()
    return _instances[name]


__all__ = ["DOMAIN_CLASSES", "Domain", "Item", "Split", "domain_names", "get_domain", "register_domain"]
