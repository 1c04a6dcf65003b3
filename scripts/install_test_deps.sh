#!/usr/bin/env bash
# Installs what the test suite needs beyond the venv: headless Chromium and its driver for the
# dashboard's browser test (tests/server/test_dashboard_browser.py), from Debian's packages
# `chromium` and `chromium-driver`. Does nothing when /usr/bin/chromium and /usr/bin/chromedriver
# are both there. Run by `make test` before pytest (and so by `.ci/run`).
# Needs apt-get and root (or sudo); otherwise it says what to install and exits non-zero.
set -euo pipefail

PACKAGES=(chromium chromium-driver)

if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    exit 0
fi

fail() {
    echo "install_test_deps: $1" >&2
    echo "install_test_deps: the dashboard's browser test needs /usr/bin/chromium and" \
        "/usr/bin/chromedriver; install them yourself (Debian/Ubuntu:" \
        "apt-get install ${PACKAGES[*]}) and run make test again." >&2
    exit 1
}

command -v apt-get >/dev/null 2>&1 || fail "no apt-get on this machine."
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || fail "not root and no sudo to install ${PACKAGES[*]}."
    # -n: fail at once instead of waiting on a password prompt nobody may see
    sudo -n true 2>/dev/null || fail "not root and sudo needs a password (try: sudo -v; make test)."
    sudo="sudo -n"
fi

apt_get() { $sudo env DEBIAN_FRONTEND=noninteractive apt-get -y -qq "$@"; }

echo "install_test_deps: installing ${PACKAGES[*]} (for the dashboard's browser test)" >&2
# Refresh the package lists only when the install fails without (a fresh image has none).
if ! apt_get install "${PACKAGES[@]}" >/dev/null 2>&1; then
    apt_get update || fail "apt-get update failed."
    apt_get install "${PACKAGES[@]}" || fail "apt-get install ${PACKAGES[*]} failed."
fi
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    fail "installed ${PACKAGES[*]} but /usr/bin/chromium or /usr/bin/chromedriver is missing."
fi
echo "install_test_deps: done" >&2
