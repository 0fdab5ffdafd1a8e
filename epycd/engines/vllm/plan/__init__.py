"""vLLM's share of planning, in the plan layer (tests/test_layers.py counts
`epycd.engines.ENGINE.plan` as plan): its types (`model.py`), route (`route.py`), sizing
(`sizing.py`), decisions on CPUs and on Instinct GPUs (`decide_cpu.py`, `decide_gpu.py`), its
typed invocation and the words of it (`invocation.py`, `argv.py`), and its planner
(`planner.py`)."""
