#!/usr/bin/env bash
# Headless Chromium + ChromeDriver (Debian packages) for the HTML report test.
# Installs only when missing; a machine without apt rights gets the browser tests skipped.
set -u
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then echo "browser-deps: not root, browser tests will be skipped"; exit 0; fi
(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
  || echo "browser-deps: could not install chromium; browser tests will be skipped"
exit 0
