"""The planner's error: an input or a plan that cannot work, said in terms of the constraint."""

from __future__ import annotations


class PlanError(ValueError):
    """A plan that breaks a constraint. `constraint` names it; the message says by how much."""

    def __init__(self, constraint: str, message: str) -> None:
        super().__init__(f"{constraint}: {message}")
        self.constraint = constraint
