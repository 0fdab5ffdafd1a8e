"""How an endpoint's errors are kept: `Problem`, an `EpycError` as data."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from epycd.errors import EpycError, Refusal


class Problem(BaseModel):
    """An `EpycError` as data: the one shape in which an endpoint's errors are kept (its
    result, its decisions, the approval state's view of an unplanned endpoint) and shown
    (`text`, one line as the CLI prints the error)."""

    model_config = ConfigDict(frozen=True)

    message: str
    file: str | None = None
    key: str | None = None
    fix: str | None = None
    exit_code: int = Field(description="2 bad input, 1 refused")
    text: str = Field(description="the whole error as one line")

    @classmethod
    def of(cls, error: EpycError) -> Problem:
        return cls(
            message=error.message,
            file=error.file,
            key=error.key,
            fix=error.fix,
            exit_code=error.exit_code,
            text=str(error),
        )

    @classmethod
    def legacy(cls, value: object) -> object:
        """A plain string, as records and callers before `Problem` held an error: a refusal."""
        if isinstance(value, str):
            return cls(message=value, exit_code=Refusal.exit_code, text=value)
        return value
