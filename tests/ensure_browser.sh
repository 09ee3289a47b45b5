#!/usr/bin/env bash
# Makes sure headless Chromium is there for the test that opens the Dagster UI like a person
# would. Called by `make test`. Installs Debian's package when it is missing and we are root
# with apt-get; otherwise says in one line what to run, and fails.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if [ "${STORMLAKE_NO_INSTALL:-}" = "" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "make test: installing chromium (Debian package) for the Dagster UI test" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  command -v chromium >/dev/null 2>&1 && exit 0
fi
echo "make test: chromium is missing; install the Debian package with: sudo apt-get install -y chromium" >&2
exit 2
