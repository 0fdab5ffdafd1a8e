"""Where each endpoint stands at run time, and the recipe's hand-off for a ready one, by
concern: `machine` (the state machine, pure), `handoff` (the hand-off text, pure), `units`
(systemctl queries), `stop` (the admin's stop marker) and `collect` (the edges that read
them all for `epycctl status` and the daemon).
"""
