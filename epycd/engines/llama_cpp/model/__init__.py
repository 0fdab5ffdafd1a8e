"""llama.cpp's share of the model facts: its architectures per pinned source (`tables.py`)
and one llama-server process's memory by term (`memory.py`). In the model layer
(tests/test_layers.py counts `epycd.engines.ENGINE.model` as model)."""
