"""Each fact stored once in an approval record: a server's decisions whose typed invocation
holds facts that some of their fields repeat (`InvocationFacts`), and the serialization
context of a record (`RECORD_CONTEXT`) under which those fields are left out."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

RECORD_CONTEXT: dict[str, Any] = {"record": True}
"""The serialization context of an approval record: an engine's decisions drop there what
their typed invocation holds (`in_record`), so the record stores each fact once."""


def in_record(info: SerializationInfo) -> bool:
    """Whether this dump writes an approval record (`RECORD_CONTEXT`)."""
    context = info.context or {}
    return all(context.get(key) == value for key, value in RECORD_CONTEXT.items())


class InvocationFacts(BaseModel):
    """A server's decisions with a typed invocation (`invocation`, an `invocation_type`)
    whose facts some of its fields repeat, for the core and the views to read: an approval
    record (a dump under `RECORD_CONTEXT`) leaves those fields out, and reading one fills
    them from the invocation, so a record stores each fact once. Decisions without an
    invocation (a record from before one) keep every field."""

    invocation_type: ClassVar[type[BaseModel]]

    @classmethod
    def invocation_facts(cls, invocation: Any) -> dict[str, Any]:
        """Its fields that are the invocation's facts, by name."""
        return {}

    @classmethod
    def nested_invocation_facts(cls, invocation: Any) -> dict[str, dict[str, Any]]:
        """The invocation's facts inside another field's object, by field."""
        return {}

    @model_validator(mode="before")
    @classmethod
    def _facts_of_invocation(cls, data: Any) -> Any:
        return cls.with_invocation_facts(data)

    @classmethod
    def with_invocation_facts(cls, data: Any) -> Any:
        """A record's decisions with the fields its invocation holds filled from it."""
        if not isinstance(data, dict) or data.get("invocation") is None:
            return data
        invocation = cls.invocation_type.model_validate(data["invocation"])
        filled = cls.invocation_facts(invocation) | data
        for field, facts in cls.nested_invocation_facts(invocation).items():
            if isinstance(filled.get(field), dict):
                filled[field] = facts | filled[field]
        return filled

    @model_serializer(mode="wrap")
    def _facts_once_in_a_record(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        invocation = getattr(self, "invocation", None)
        if invocation is None or not in_record(info):
            return data
        for key in self.invocation_facts(invocation):
            data.pop(key, None)
        for field, facts in self.nested_invocation_facts(invocation).items():
            if isinstance(data.get(field), dict):
                data[field] = {k: v for k, v in data[field].items() if k not in facts}
        return data
