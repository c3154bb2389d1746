#!/usr/bin/env bash
# Debian packages the project needs: shellcheck (tests of the rendered launch scripts) and the shared
# libraries Mooncake's transfer engine loads (PD disaggregation, docs/pd.md: `import mooncake.engine`
# fails with "libibverbs.so.1: cannot open shared object file" without them).
# Installs only what is missing; needs root (CI and the dev machines run as root).
set -euo pipefail
need=()
command -v shellcheck >/dev/null 2>&1 || need+=(shellcheck)
# package:library it provides (checked with ldconfig)
for pair in libibverbs1:libibverbs.so.1 librdmacm1:librdmacm.so.1 libnuma1:libnuma.so.1 liburing2:liburing.so.2 \
            libcurl4:libcurl.so.4; do
  ldconfig -p 2>/dev/null | grep -q "${pair#*:}" || need+=("${pair%%:*}")
done
dpkg -s rdma-core >/dev/null 2>&1 || need+=(rdma-core)  # libibverbs' device providers and config
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "system-deps: missing ${need[*]}; install them (apt-get install ${need[*]}) or run as root" >&2
  exit 1
fi
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
