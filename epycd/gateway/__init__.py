"""The gateway: one URL for every approved endpoint, a key per client (docs/gateway.md)."""
