#!/usr/bin/env bash
# Debian's chromium for tests/test_web.py (`cockpit web` opened in a real headless browser, driven
# over the DevTools protocol; no browser download). Idempotent: a no-op when chromium is installed.
# Installs as root with apt-get; otherwise says why not (the test then skips, or fails under CI=true).
set -euo pipefail
for name in chromium chromium-browser google-chrome; do
  if command -v "$name" >/dev/null 2>&1; then
    exit 0
  fi
done
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "[chromium] apt-get install chromium"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  command -v chromium >/dev/null 2>&1 || { echo "[chromium] chromium still missing after apt-get" >&2; exit 1; }
else
  echo "[chromium] not installing chromium (needs root and apt-get); tests/test_web.py's browser test will skip (fail under CI=true)" >&2
fi
