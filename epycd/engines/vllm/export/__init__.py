"""vLLM's Kubernetes export (`kube.py`: `EXPORTER`), in the export layer: the pod's node
selection (`nodes.py`) and volumes (`volumes.py`)."""
