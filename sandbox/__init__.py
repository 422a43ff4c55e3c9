"""Run untrusted, model-written Python without letting it hurt the host (see sandbox.runner).

Standard library only, and nothing from the rest of the project: the graders in
stages/ depend on it, never the other way round."""

from cascade.sandbox.runner import SandboxLimits, Verdict, isolation_mode, run_many, run_python

__all__ = ["SandboxLimits", "Verdict", "isolation_mode", "run_python", "run_many"]
