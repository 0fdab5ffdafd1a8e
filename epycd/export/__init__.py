"""Exports: the same approved or current plan written for another engine than systemd.

`kube.py` turns a `Plan` into Kubernetes objects (and a KServe InferenceService), the
KubeletConfiguration fragment the nodes need, and the notes that say, in words, each host
decision with no Kubernetes equivalent (docs/fleet.md).
"""
