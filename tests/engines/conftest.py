"""The planner's workspace (tests/plan) and the approval sandbox (tests/approval), for the
engine-wide tests."""

from tests.approval.conftest import env
from tests.plan.conftest import host_of, ws

__all__ = ["env", "host_of", "ws"]
