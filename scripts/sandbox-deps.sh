#!/usr/bin/env bash
# bubblewrap (Debian package `bubblewrap`) for the HumanEval judge's sandbox (docs/evaluation.md).
# Installs only when missing; without it the judge runs in its weaker fallback mode and says so.
set -u
if command -v bwrap >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" != 0 ]; then echo "sandbox-deps: not root, the judge will use its fallback mode"; exit 0; fi
(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null) \
  || echo "sandbox-deps: could not install bubblewrap; the judge will use its fallback mode"
exit 0
