"""vLLM's share of planning: its planner (`planner.py`). It sits in the plan layer
(tests/test_layers.py counts `epycd.engines.ENGINE.plan` as plan); vLLM's route, sizing and
decisions are still `epycd.plan.route`, `sizing`, `tuning`, `decide_cpu` and `gpu_decide`."""
