"""The failures a user sees as one line, defined where importing them costs nothing: the CLI catches them on every
error path, and the modules that raise them import torch, transformers or Prefect (a bad recipe name took 11 s to
report while the handler imported those)."""


class ModelSourceError(ValueError):
    """A model source that is none of the kinds `stages.train.model_source.resolve_model_dir` takes; one line for the
    user."""


class DistributedStageError(RuntimeError):
    """A launched job of a stage (torchrun or Ray) failed; the message is one line."""


class GateFailed(RuntimeError):
    """The regression gate under policy `fail` found a domain below its tolerance; the message names it."""


class NonFiniteSteps(RuntimeError):
    """Optimizer steps in a row whose loss or gradient was not finite (stages/train/training.py); the message names the
    steps and the likely cause."""


class RecipeError(ValueError):
    """Bad recipe input; the CLI prints it as one line and exits 2."""
