"""`python -m epycd.spec`: the table of endpoint-file keys for docs/admin.md."""

from epycd.spec.keys import keys_markdown

print(keys_markdown(), end="")
