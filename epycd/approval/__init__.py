"""Approval: nothing reaches systemd without a person's approval of exactly what will run.

record: the approval file; install: the crash-safe install transaction; state: drift;
check: the boot-time check; permissions: who may change things.
"""
