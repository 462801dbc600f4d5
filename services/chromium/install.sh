#!/usr/bin/env bash
# Install Chromium from Debian's packages for the browser tests (tests/browser): they drive the
# system binary /usr/bin/chromium with Playwright and never download a browser.
# Idempotent: does nothing when /usr/bin/chromium exists. Needs root (apt-get).
#
# Usage: services/chromium/install.sh
set -euo pipefail

BINARY=/usr/bin/chromium
if [ -x "$BINARY" ]; then
  echo "[chromium] $BINARY is installed ($("$BINARY" --version 2>/dev/null || echo 'version unknown'))"
  exit 0
fi
APT=(apt-get install -y --no-install-recommends chromium)
echo "[chromium] $BINARY is missing: ${APT[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! "${APT[@]}"; then
  echo "[chromium] the install failed: apt-get update, then once more"
  apt-get update
  "${APT[@]}"
fi
[ -x "$BINARY" ] || { echo "[chromium] $BINARY is still missing after the install" >&2; exit 1; }
echo "[chromium] installed: $("$BINARY" --version 2>/dev/null || echo "$BINARY")"
