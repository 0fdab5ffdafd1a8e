"""The epyc-llm commands every endpoint unit runs around vLLM: the approval check
(`ExecCondition=`) and the crash recorder (`ExecStopPost=`, docs/healing.md)."""

from __future__ import annotations

APPROVAL_CHECK_MODULE = "epycd.approval.check"
CRASH_RECORDER_MODULE = "epycd.approval.crashloop"


def approval_check_argv(product_python: str, name: str, unit: str | None = None) -> list[str]:
    """ExecCondition= of every endpoint unit: skip the start when the approval no longer holds
    or the unit is in a crash loop. `unit`: an instance's own, epyc-llm-NAME_N (without it the
    check means the endpoint's own unit, epyc-llm-NAME)."""
    return [product_python, "-m", APPROVAL_CHECK_MODULE, name, *(["--unit", unit] if unit else [])]


def crash_recorder_argv(product_python: str, name: str, unit: str) -> list[str]:
    """ExecStopPost= of every vLLM unit (docs/healing.md): record how the run of `unit`
    (epyc-llm-NAME, or epyc-llm-NAME_N for an instance) ended, from the SERVICE_RESULT,
    EXIT_CODE and EXIT_STATUS systemd passes, and declare the crash loop."""
    return [product_python, "-m", CRASH_RECORDER_MODULE, name, "--unit", unit]
