"""llama.cpp's share of planning: its route, model check, memory fit and decisions. It sits
in the plan layer (tests/test_layers.py counts `epycd.engines.ENGINE.plan` as plan), above
the engine's running-side facts in `epycd.engines.llama_cpp`."""
