# Sourced into each tests/tools/*.sh that tests/bootstrap.sh runs (through BASH_ENV): a
# command that fails under `set -e` names the tool, its line and the command before the
# tool exits, so a bootstrap from an empty cache never stops without a word.
set -o errtrace
trap 'echo "${BASH_SOURCE[0]##*/tests/tools/}: line $LINENO failed (exit $?): $BASH_COMMAND" >&2' ERR
