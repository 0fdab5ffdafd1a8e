"""epyc-llm: sized, pinned, approved vLLM endpoints on AMD EPYC CPUs."""

__version__ = "0.1.0"
