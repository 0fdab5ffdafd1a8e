"""The socket memory fit (weights, KV pool, vLLM's own processes and headroom add up inside
the chosen socket's memory: docs/tuning.md rules 3 and 7) and its rules."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epycd.engines.vllm.plan.sizing import fit_socket
from epycd.engines.vllm.plan.tuning import KV_MARGIN, kv_pool_gib
from epycd.errors import InputError
from epycd.model.facts import MemoryFit
from epycd.plan.tuning import headroom_gib
from epycd.sizes import GIB
from tests.model.models import LLAMA_8B_TOTAL_SIZE, LLAMA_70B_TOTAL_SIZE

LLAMA_KV = 131072  # bytes per token: 2 x 32 layers x 8 KV heads x 128 x 2 bytes
LLAMA_POSITIONS = 131072
LLAMA_8B_ON_64_GIB: dict[str, Any] = dict(
    runtime_gib=0.0,
    weights_bytes=LLAMA_8B_TOTAL_SIZE,
    kv_bytes_per_token=LLAMA_KV,
    max_position_embeddings=LLAMA_POSITIONS,
    max_model_len=4096,
    max_num_seqs=1,
    socket_total_gib=64.0,
    socket_available_gib=64.0,
)
"""The arguments each test changes: Llama 3.1 8B (bf16), one 4096-token sequence, alone on
an idle 64 GiB socket, vLLM's own processes not counted."""


def fit_with(**changes: Any) -> MemoryFit:
    return fit_socket(**{**LLAMA_8B_ON_64_GIB, **changes})


def socket_of(gib: float) -> dict[str, float]:
    """A socket of `gib` GiB, all of it available."""
    return {"socket_total_gib": gib, "socket_available_gib": gib}


@pytest.mark.parametrize(
    ("total", "pool"),
    [(2, 1), (3.6, 1), (16, 8), (24, 12), (32, 16), (40, 16), (64, 25), (384, 153), (1536, 614)],
)
def test_kv_pool(total: float, pool: int) -> None:
    assert kv_pool_gib(total) == pool


@pytest.mark.parametrize(("total", "headroom"), [(8, 2.0), (64, 6.4), (160, 16.0), (768, 16.0)])
def test_headroom(total: float, headroom: float) -> None:
    assert headroom_gib(total) == pytest.approx(headroom)


def llama_8b(max_model_len: int, seqs: int) -> MemoryFit:
    return fit_with(max_model_len=max_model_len, max_num_seqs=seqs)


def test_llama_8b_full_context_4_seqs_does_not_fit_64_gib_and_the_suggestion_fits() -> None:
    fit = llama_8b(131072, 4)
    assert not fit.fits
    assert fit.kv_gb == 64.0
    assert fit.kv_pool_gb == 25
    assert fit.suggested_max_model_len == 51200
    assert str(fit.suggested_max_model_len) in fit.action
    again = llama_8b(fit.suggested_max_model_len, 4)
    assert again.fits and again.action == "fits"
    assert not llama_8b(fit.suggested_max_model_len + 256, 4).fits
    assert again.required_gb <= again.available_gb


def test_70b_bf16_weights_alone_do_not_fit_64_gib() -> None:
    fit = fit_with(weights_bytes=LLAMA_70B_TOTAL_SIZE, kv_bytes_per_token=2 * 80 * 8 * 128 * 2)
    assert not fit.fits
    assert fit.suggested_max_model_len is None
    assert "does not fit in socket memory" in fit.action
    assert fit.weights_gb == pytest.approx(131.42, abs=0.01)


def test_context_is_capped_by_max_positions_and_defaults_to_it() -> None:
    assert llama_8b(10**7, 1).context == LLAMA_POSITIONS
    default = fit_with(
        weights_bytes=1, kv_bytes_per_token=1, max_position_embeddings=40960, max_model_len=None
    )
    assert default.context == 40960


def test_the_first_numa_node_limits_the_pool() -> None:
    common: dict[str, Any] = dict(
        weights_bytes=8 * GIB, max_model_len=8192, socket_total_gib=384, socket_available_gib=380
    )
    whole = fit_with(**common)
    assert whole.kv_pool_cap_gb == kv_pool_gib(384) == 153
    node = fit_with(**common, first_node_available_gib=95)
    assert node.kv_pool_cap_gb == math.floor(95 - 8 * 95 / 380) == 93
    starved = fit_with(**common, first_node_available_gib=0.5)
    assert not starved.fits and starved.suggested_max_model_len is None
    assert "NUMA node" in starved.action


def test_available_memory_not_total_decides() -> None:
    busy = fit_with(max_model_len=8192, socket_available_gib=20)
    assert busy.kv_pool_gb == 0 and not busy.fits
    assert "does not fit in socket memory" in busy.action


def test_too_many_sequences_even_at_256_tokens() -> None:
    fit = fit_with(weights_bytes=GIB, max_num_seqs=100000, **socket_of(16))
    assert not fit.fits and fit.suggested_max_model_len is None
    assert "max_num_seqs" in fit.action


def test_bad_values_are_bad_input() -> None:
    with pytest.raises(InputError, match="max_num_seqs"):
        llama_8b(4096, 0)
    with pytest.raises(InputError, match="max_model_len"):
        fit_with(
            weights_bytes=1,
            kv_bytes_per_token=1,
            max_position_embeddings=None,
            max_model_len=None,
            **socket_of(8),
        )


@dataclass(frozen=True)
class ModelOnSocket:
    """A model and the socket it is fitted in, as the property tests draw them."""

    weights_gib: float
    kv_per_token: int
    positions: int
    total: float
    free: float

    @property
    def available(self) -> float:
        return self.total * self.free

    def args(self) -> dict[str, Any]:
        return dict(
            weights_bytes=int(self.weights_gib * GIB),
            kv_bytes_per_token=self.kv_per_token,
            max_position_embeddings=self.positions,
            socket_total_gib=self.total,
            socket_available_gib=self.available,
        )


MODELS_ON_SOCKETS = st.builds(
    ModelOnSocket,
    weights_gib=st.floats(0.1, 300),
    kv_per_token=st.integers(1_000, 1_000_000),
    positions=st.integers(512, 1_048_576),
    total=st.floats(2, 2048),
    free=st.floats(0.1, 1.0),
)


@given(case=MODELS_ON_SOCKETS, wanted=st.integers(1, 2_000_000), seqs=st.integers(1, 64))
def test_fit_invariants(case: ModelOnSocket, wanted: int, seqs: int) -> None:
    args = {**case.args(), "max_num_seqs": seqs}
    fit = fit_with(max_model_len=wanted, **args)
    assert fit.context == min(wanted, case.positions)
    assert fit.kv_pool_gb <= kv_pool_gib(case.total)
    if fit.fits:
        assert fit.required_gb <= fit.available_gb + 0.01
        assert fit.suggested_max_model_len is None
    elif fit.suggested_max_model_len is not None:
        suggested = fit.suggested_max_model_len
        assert suggested % 256 == 0 and suggested < fit.context
        assert fit_with(max_model_len=suggested, **args).fits
        assert not fit_with(max_model_len=suggested + 256, **args).fits


def test_the_pool_is_what_the_sequences_need_plus_the_margin() -> None:
    """Rule 3: 4 x 8192 tokens x 128 KiB = 4 GiB of KV, +10 % -> a 5 GiB pool, not the
    153 GiB the socket could give (the old pool filled the node)."""
    fit = fit_with(
        weights_bytes=8 * GIB,
        max_model_len=8192,
        max_num_seqs=4,
        socket_total_gib=384,
        socket_available_gib=380,
    )
    assert fit.fits and fit.kv_gb == 4.0
    assert fit.kv_pool_gb == math.ceil(4.0 * (1 + KV_MARGIN)) == 5
    assert fit.kv_pool_cap_gb == 153


def test_without_max_num_seqs_the_target_is_cut_to_what_fits() -> None:
    """Rule 2: the profile's 128 sequences of 8192 tokens (128 GiB of KV) do not fit a 64 GiB
    socket's cap (25 GiB): as many full sequences as the cap holds, no fewer than 1."""
    common: dict[str, Any] = dict(max_num_seqs=None, target_seqs=128)
    fit = fit_with(max_model_len=8192, **common)
    assert fit.fits and fit.kv_pool_cap_gb == 25
    assert fit.max_num_seqs == math.floor(25 / (1.0 * (1 + KV_MARGIN))) == 22
    assert fit.kv_gb <= fit.kv_pool_gb <= fit.kv_pool_cap_gb
    short = fit_with(max_model_len=1024, **common)
    assert short.max_num_seqs == 128, "where memory allows, vLLM's default is kept"
    longest = fit_with(max_model_len=131072, **common)
    assert longest.max_num_seqs == 1 and longest.fits
    too_long = fit_with(max_model_len=131072, **common, **socket_of(32))
    assert too_long.max_num_seqs == 1 and not too_long.fits


@given(
    case=MODELS_ON_SOCKETS,
    wanted=st.integers(1, 2_000_000),
    target=st.integers(1, 512),
    first_share=st.floats(0.1, 1.0),
)
def test_sized_pool_invariants(
    case: ModelOnSocket, wanted: int, target: int, first_share: float
) -> None:
    """Rules 2 and 3: the pool never exceeds the nodes' available memory (nor the first
    node's), and the chosen max_num_seqs full-context sequences fit the pool."""
    available, weights_gib = case.available, case.weights_gib
    fit = fit_with(
        **case.args(),
        max_model_len=wanted,
        max_num_seqs=None,
        first_node_available_gib=available * first_share,
        target_seqs=target,
    )
    assert 1 <= fit.max_num_seqs <= target
    assert fit.kv_pool_gb <= fit.kv_pool_cap_gb or not fit.fits
    assert fit.kv_pool_gb <= max(0, available - weights_gib)
    assert fit.kv_pool_gb <= max(0, available * first_share)
    if fit.fits:
        assert fit.kv_bytes_per_token * fit.context * fit.max_num_seqs <= fit.kv_pool_gb * GIB
        assert fit.required_gb <= fit.available_gb + 0.01
    elif fit.max_num_seqs > 1:
        raise AssertionError("memory cut max_num_seqs yet the fit fails")


def test_the_runtime_is_part_of_the_servers_peak_and_of_the_required_memory() -> None:
    """Rule 7: vLLM's own processes are counted beside weights and KV; headroom apart."""
    bare = fit_with(weights_bytes=GIB, runtime_gib=0.0)
    fit = fit_with(weights_bytes=GIB, runtime_gib=1.75)
    assert fit.runtime_gb == 1.75
    assert fit.process_gb == pytest.approx(fit.weights_gb + fit.kv_pool_gb + 1.75, abs=0.01)
    assert fit.required_gb == pytest.approx(fit.process_gb + fit.headroom_gb, abs=0.01)
    assert fit.required_gb == pytest.approx(bare.required_gb + 1.75, abs=0.01)
    assert fit.headroom_gb == bare.headroom_gb == headroom_gib(64)


def test_a_socket_too_small_for_the_runtime_is_refused_with_the_numbers() -> None:
    """Without the runtime this socket holds weights + 1 GiB KV + headroom; with it, not."""
    available = 0.5 + 1 + 2.0 + 1.0  # weights + min pool + headroom + 1 GiB to spare
    small: dict[str, Any] = dict(
        weights_bytes=GIB // 2,
        kv_bytes_per_token=512,
        max_position_embeddings=2048,
        max_model_len=2048,
        **socket_of(available),
    )
    assert fit_with(**small, runtime_gib=0.0).fits
    fit = fit_with(**small, runtime_gib=2.0)
    assert not fit.fits
    assert "2.00 GiB vLLM's own processes" in fit.action
    assert f"{available:.2f} GiB available" in fit.action
