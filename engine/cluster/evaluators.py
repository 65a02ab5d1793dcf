"""The Evaluator of a kernel plan whose environment is not local: the same stages as
``engine.kernels.pipeline.Evaluator``, run as tasks on a Ray cluster (``ray_eval``) or inside a
container image (``container``). The analyze and compare modes (``engine.jobs.modes``) ask for
one; this module knows nothing of jobs or executors."""

from __future__ import annotations

from typing import Any

from engine.errors import MagpieError


def evaluator_for(plan: Any, ws: Any, machine: Any, cancel: Any) -> Any:
    """The Evaluator of a plan whose environment is not local."""
    if plan.environment == "ray":
        from engine.cluster.ray_eval import RayEvaluator
        return RayEvaluator(plan, ws, machine, cancel)
    if plan.environment == "container":
        from engine.cluster.container import ContainerEvaluator
        return ContainerEvaluator(plan, ws, machine, cancel)
    raise MagpieError(f"no evaluator for environment {plan.environment!r}", title="executor")
