"""vLLM's model terms: its memory fit in a socket's RAM (`memory.py`) and the footprint of
its own processes per version (`footprint.py`)."""
