"""The one grammar of an endpoint file's extra_args (epycd.spec.flags): every spelling vLLM's
parser reads, the same for what the file may pass (arg_refusal), the consent its flags need
(consent_reasons) and whether it gives a flag itself (given, value)."""

from __future__ import annotations

import pytest

from epycd.engines.vllm.plan.tuning import compile_choice
from epycd.spec import EndpointSpec
from epycd.spec.flags import ExtraFlags, Flag, flag_name, names, read_flags
from epycd.spec.policy import arg_refusal, consent_reasons

GRAMMAR = [
    # words, flag asked, given, value
    (["--max-num-batched-tokens", "4096"], "--max-num-batched-tokens", True, "4096"),
    (["--max-num-batched-tokens=4096"], "--max-num-batched-tokens", True, "4096"),
    (["--max_num_batched_tokens=4096"], "--max-num-batched-tokens", True, "4096"),
    (["--max_num_batched_tokens", "4096"], "--max-num-batched-tokens", True, "4096"),
    (["--compilation-config.level=3"], "--compilation-config", True, None),
    (["--compilation_config.mode", "3"], "--compilation-config", True, None),
    (["--override-neuron=-1"], "--override-neuron", True, "-1"),
    (["--override-neuron", "-1"], "--override-neuron", True, None),
    (["--stream-interval="], "--stream-interval", True, ""),
    (["--stream-interval"], "--stream-interval", True, None),
    (["--enforce-eager", "--stream-interval", "2"], "--enforce-eager", True, None),
    (["--enforce-eager", "--stream-interval", "2"], "--stream-interval", True, "2"),
    (["--enforce_eager"], "--enforce-eager", True, None),
    (["--enforce-eag"], "--enforce-eager", True, None),
    (["--max-num-batched=8"], "--max-num-batched-tokens", True, "8"),
    (["--m"], "--max-num-seqs", False, None),
    (["--enforce-eager-x"], "--enforce-eager", False, None),
    (["--no-enforce-eager"], "--enforce-eager", False, None),
    (["--tool-server", "demo"], "--demo", False, None),
    (["-O3"], "--optimization-level", False, None),
    (["--"], "--", False, None),
    (["--stream-interval=1", "--stream-interval", "8"], "--stream-interval", True, "8"),
    ([], "--enforce-eager", False, None),
]


@pytest.mark.parametrize(
    ("words", "flag", "given", "value"),
    GRAMMAR,
    ids=[" ".join(g[0]) + f" ? {g[1]}" for g in GRAMMAR],
)
def test_the_grammar(words: list[str], flag: str, given: bool, value: str | None) -> None:
    extra = ExtraFlags.of(words)
    assert extra.words == tuple(words)
    assert extra.given(flag) is given
    assert extra.value(flag) == value


def test_each_flag_with_its_key_value_and_position() -> None:
    words = ["--a_b.c=1", "--d", "v", "-x", "w", "--e", "--f="]
    assert read_flags(words) == (
        Flag("--a-b", "c", "1", 0),
        Flag("--d", None, "v", 1),
        Flag("--e", None, None, 5),
        Flag("--f", None, "", 6),
    )
    assert ExtraFlags.of(words).flags == read_flags(words)


@pytest.mark.parametrize(
    ("word", "name"),
    [("--a_b=c_d", "--a-b"), ("--a.b_c=d", "--a"), ("--a", "--a"), ("-a", None), ("--", None),
     ("value", None), ("/path", None)],
)  # fmt: skip
def test_flag_name(word: str, name: str | None) -> None:
    assert flag_name(word) == name


def test_names_families_and_abbreviations() -> None:
    assert names("--data-parallel-size", "--data-parallel-*")
    assert names("--data", "--data-parallel-*")
    assert names("--dev", "--device") and not names("--d", "--device")
    assert not names("--device-ids", "--device")


def test_it_survives_a_record_and_a_copy() -> None:
    """It goes into the typed invocation of a plan and back: the parse is made again."""
    extra = ExtraFlags.of(["--enforce-eager"])
    again = ExtraFlags.model_validate_json(extra.model_dump_json())
    assert again == extra and again.given("--enforce-eager")
    copied = extra.model_copy(update={"words": ("--stream-interval", "3")})
    assert copied.value("--stream-interval") == "3" and not copied.given("--enforce-eager")


def test_the_spec_reads_its_extra_args_with_it() -> None:
    spec = EndpointSpec(extra_args=["--max_num_batched_tokens=4096"])
    assert spec.extra_flags == ExtraFlags.of(spec.extra_args)
    assert spec.extra_flags.value("--max-num-batched-tokens") == "4096"


@pytest.mark.parametrize(
    "word",
    ["--port=1", "--served_model_name=x", "--po", "--data_parallel_size=2", "--numa-bind.x=1"],
)
def test_an_owned_flag_is_refused_in_every_spelling(word: str) -> None:
    assert arg_refusal(word) is not None


CONSENT = [
    (["--trust-remote-code"], "extra_args --trust-remote-code: it runs the model repository's "
     "own Python code inside the server"),
    (["--trust_remote_code"], "extra_args --trust-remote-code: it runs the model repository's "
     "own Python code inside the server"),
    (["--otlp-traces-endpoint", "http://otel:4317"], "extra_args --otlp-traces-endpoint "
     "http://otel:4317: it sends a trace of every request to http://otel:4317"),
    (["--otlp_traces_endpoint=http://otel:4317"], "extra_args --otlp-traces-endpoint "
     "http://otel:4317: it sends a trace of every request to http://otel:4317"),
    (["--otlp-traces-endpoint", "--enforce-eager"], "extra_args --otlp-traces-endpoint: it "
     "sends a trace of every request to (no value)"),
    (["--otlp-traces-endpoint="], "extra_args --otlp-traces-endpoint : it sends a trace of "
     "every request to (no value)"),
    (["--tool-serv", "demo"], "extra_args --tool-server demo: it sends the model's tool calls "
     "to demo (`demo`: a web browser and a code interpreter)"),
    (["--allowed-local-media-path.x=/srv"], "extra_args --allowed-local-media-path /srv: API "
     "clients may make the server read any file under /srv it can read"),
    (["--enable-log-requests", "-x"], "extra_args --enable-log-requests: it writes every "
     "prompt to the journal, for whoever reads the journal"),
]  # fmt: skip


@pytest.mark.parametrize(("words", "reason"), CONSENT, ids=[" ".join(c[0]) for c in CONSENT])
def test_the_consent_texts_are_the_fingerprinted_ones(words: list[str], reason: str) -> None:
    """Byte for byte the texts of the hand parse this grammar replaced: they go into the
    inputs fingerprint, a changed text would ask every approver again."""
    assert consent_reasons(words, {}) == [reason]
    assert consent_reasons(ExtraFlags.of(words), {}) == [reason]
    recipe = consent_reasons(words, {}, where="the Instinct recipe's args")
    assert recipe == [reason.replace("extra_args", "the Instinct recipe's args", 1)]


@pytest.mark.parametrize("words", [["--enforce-eager"], ["--enforce_eager"], ["--enforce-eag"]])
def test_an_eager_endpoint_file_needs_no_compiler(words: list[str]) -> None:
    """Rule 4 asks whether the file runs eager itself in the same grammar."""
    for extra in (words, ExtraFlags.of(words)):
        eager, warnings = compile_choice(
            "throughput", host_vllm=True, cxx=None, file="f.toml", extra_args=extra
        )
        assert (eager, warnings) == (False, [])
