"""The stage kinds: one folder per kind, `stages/kinds/<kind>/`, which owns its whole registry row: its config, the
checks only it knows, its plan estimate and report card, and its run function (in the folder's `run_<kind>.py`, named by
string and imported on the row's first call, `imported_on_call`: validating a recipe never loads torch). Adding a
kind is adding a folder: importing this package imports every folder in it (`load_kinds`), and each registers
its row (`register_kind`, stages/kinds/registry.py). Kinds meet only through the products one stage reads of
another (stages/products.py), never through each other's modules (tests/test_layering.py).
"""

from cascade.stages.kinds.registry import (
    KINDS,
    StageInputs,
    StageKind,
    chooses_teachers,
    gain_targets,
    kind_of,
    load_kinds,
    recovery_kinds,
    register_kind,
    run_stage,
    unregister_kind,
)

__all__ = [
    "KINDS",
    "StageInputs",
    "StageKind",
    "chooses_teachers",
    "gain_targets",
    "kind_of",
    "recovery_kinds",
    "register_kind",
    "run_stage",
    "unregister_kind",
]

load_kinds(__name__, __path__)
