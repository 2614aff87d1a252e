#!/usr/bin/env bash
# Installs headless Chromium (Debian's chromium package) when it is missing:
# the status page test (tests/it/page.rs) drives the page in a real browser.
# Sourced by ops/test.sh, and so by .ci/run.
if ! command -v chromium >/dev/null 2>&1; then
  echo "chromium not found: installing Debian's chromium package (~125 MB download, ~415 MB on disk)" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  # Wait for another apt run (a parallel install) rather than failing on its lock.
  $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
