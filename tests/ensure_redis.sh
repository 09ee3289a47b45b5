#!/usr/bin/env bash
# Makes sure redis-server is there for the tests of steps on Celery workers (the broker:
# tests/e2e/test_celery.py). Called by `make test`. Installs Debian's package when it is missing
# and we are root with apt-get; otherwise says in one line what to run, and fails.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
if [ "${STORMLAKE_NO_INSTALL:-}" = "" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "make test: installing redis-server (Debian package) for the Celery worker tests" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null
  command -v redis-server >/dev/null 2>&1 && exit 0
fi
echo "make test: redis-server is missing; install the Debian package with: sudo apt-get install -y redis-server" >&2
exit 2
