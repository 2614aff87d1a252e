#!/usr/bin/env bash
# Builds the release binary (default features: mimalloc; without `tools`) and
# the Debian package, target/debian/seatgate_<version>-1_<arch>.deb (or
# $CARGO_TARGET_DIR/debian/), with cargo-deb; installs cargo-deb first if it
# is missing. Prints the package's path as the last line. What the package
# holds: Cargo.toml, [package.metadata.deb]; how to install it:
# docs/install.md, "Install from the package".
# A second run with nothing changed rebuilds nothing and repackages in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO_DEB_VERSION=3.8.0
if ! cargo deb --version >/dev/null 2>&1; then
  echo "installing cargo-deb $CARGO_DEB_VERSION (cargo install, a few minutes)" >&2
  # Its own temporary build directory, not the project's target directory.
  env -u CARGO_TARGET_DIR cargo install cargo-deb --version "$CARGO_DEB_VERSION" --locked --quiet
fi
# dpkg-shlibdeps (dpkg-dev) works out the package's Depends (libc) from the binary.
if ! command -v dpkg-shlibdeps >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq dpkg-dev >/dev/null
fi
# Stripped: the release profile's line tables would make the binary 74 MB.
cargo deb -p seatgate --locked --strip "$@"
