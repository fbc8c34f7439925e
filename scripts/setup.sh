#!/usr/bin/env bash
# Installs the Debian packages Waystone needs to build and test. Idempotent:
# when everything is present it prints nothing and touches nothing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config lld
  libsqlite3-dev sqlite3 libcurl4-openssl-dev libssl-dev
  libyaml-cpp-dev nlohmann-json3-dev libcpp-httplib-dev libcli11-dev
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev curl
  libnats-dev nats-server prometheus libpq-dev postgresql
  python3 clang clang-format libclang-rt-14-dev libboost1.81-dev chromium
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# npm-pinned test dependencies, each installed with `npm ci` when its package-lock.json
# changed since the last install (marker: node_modules/.package-lock.json.installed):
# - tests/console: the console's browser tests (playwright-core and axe-core);
# - tests/targets/smtp: the SMTP test target (smtp-server).
repo_root="$(dirname "$0")/.."
if command -v npm >/dev/null 2>&1; then
  for dir in tests/console tests/targets/smtp; do
    if ! cmp -s "$repo_root/$dir/package-lock.json" "$repo_root/$dir/node_modules/.package-lock.json.installed"; then
      echo "setup: npm ci in $dir" >&2
      (cd "$repo_root/$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null &&
         cp package-lock.json node_modules/.package-lock.json.installed)
    fi
  done
else
  echo "setup: npm is missing; the console's browser test (ConsoleBrowserTest) and the SMTP target's self-test (SmtpTargetSelfTest) will fail" >&2
fi
