"""The llama.cpp tests share the health tests' process reaper."""

from tests.health.conftest import reap

__all__ = ["reap"]
