#!/usr/bin/env bash
# The CPU CI job (.ci/run calls this): exactly the README's test command, and a hard failure
# when pytest collects no tests (pytest's exit status 5), so an empty run never passes.
set -uo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
# README test command (tests/test_readme.py checks that the two stay identical):
pip install ".[test]" && python -m pytest -q -rs tests
rc=$?
echo "ci/cpu.sh: exit ${rc} after $(( $(date +%s) - start )) s"
if [ "${rc}" -eq 5 ]; then
  echo "ci/cpu.sh: pytest collected no tests: failing" >&2
  exit 1
fi
exit "${rc}"
