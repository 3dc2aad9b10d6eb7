#!/usr/bin/env bash
# Install the CUDA peers (QuACK + cutlass-dsl, apache-tvm-ffi for SGLang's and FlashInfer's
# JIT kernels) and the notebook toolchain on an air-gapped GPU node, from the two bundles
# `python -m rope_kernels carry` builds (.carry/a, .carry/b; rope_kernels/infra/carry.py).
# Run from the repository root, in two device calls started back to back (/tmp lives
# only while the machine stays warm):
#   call 1, carrying .carry/a:          bash tools/device_setup.sh stage
#   call 2, carrying .carry/b, .peers:  bash tools/device_setup.sh install [&& more commands]
#   any call, carrying .carry/c:        bash tools/device_setup.sh aic   (aiconfigurator-core,
#                                       the H100's and H200's tables only, for notebook 04's TTFT)
# then in every later call: eval "$(bash tools/device_setup.sh env)"
# Every file is checked against the sha256 sums the bundles carry; nothing is downloaded.
set -euo pipefail

STAGE=${STAGE:-/tmp/q}
SITE=${SITE:-/tmp/site}
AIC=${AIC:-/tmp/aic}
PY=${PYTHON:-python3}
PIP=${PIP:-"$PY -m pip"}  # tests/test_carry.py puts a recorder here

env_lines() {
  local aic=""
  [ -f "$AIC/.checked" ] && aic=":$AIC"
  echo "export PYTHONPATH=$PWD:$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages$aic\${PYTHONPATH:+:\$PYTHONPATH}"
  # SGLang's JIT links -lcudart from CUDA_HOME, else from the folder above `which nvcc`
  # (wrong where nvcc on PATH is a wrapper outside the toolkit): name the toolkit
  if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
    echo "export CUDA_HOME=/usr/local/cuda"
  fi
}

stage() {
  [ -f .carry/a/SHA256SUMS.a ] || { echo "device_setup: no .carry/a here (carry it in this call)" >&2; exit 2; }
  (cd .carry/a && sha256sum -c --quiet SHA256SUMS.a)
  mkdir -p "$STAGE"
  cp -r .carry/a/. "$STAGE"/
  (cd "$STAGE" && sha256sum -c --quiet SHA256SUMS.a)
  echo "device_setup: bundle a staged in $STAGE ($(du -sh "$STAGE" | cut -f1)); start call 2 now"
}

install() {
  [ -f .carry/b/SHA256SUMS.b ] || { echo "device_setup: no .carry/b here (carry it in this call)" >&2; exit 2; }
  [ -f "$STAGE/SHA256SUMS.a" ] || { echo "device_setup: $STAGE holds no bundle a: run 'stage' in the call before, back to back" >&2; exit 2; }
  [ -d .peers ] || echo "device_setup: warning: no .peers here (carry it: SGLang's and FlashInfer's pinned files)" >&2
  (cd .carry/b && sha256sum -c --quiet SHA256SUMS.b)
  (cd "$STAGE" && sha256sum -c --quiet SHA256SUMS.a)
  cp -r .carry/b/. "$STAGE"/
  cd "$STAGE"
  read -r xz wheel < JOINED
  cat "$xz".part-* > "$xz"
  grep " $xz\$" SHA256SUMS.joined | sha256sum -c --quiet
  if command -v xz >/dev/null; then xz -dc "$xz" > "$wheel"
  else "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 20)' "$xz" "$wheel"
  fi
  grep " $wheel\$" SHA256SUMS.joined | sha256sum -c --quiet
  rm -f "$xz"
  echo "device_setup: $wheel joined and checked"
  # shellcheck disable=SC2046,SC2086
  $PIP install -q --no-index --no-deps --upgrade --target "$SITE" $(cat PEER_WHEELS)
  export PIP_BREAK_SYSTEM_PACKAGES=1  # the node's own Python; nothing else is installed there
  # shellcheck disable=SC2046,SC2086
  $PIP install -q --no-index --find-links toolchain $(sed -n 1p TOOLCHAIN)
  # shellcheck disable=SC2046,SC2086
  $PIP install -q --no-index --no-deps --find-links toolchain $(sed -n 2p TOOLCHAIN)
  cd - >/dev/null
  echo "device_setup: peers in $SITE, toolchain installed; in this and every later call:"
  env_lines
}

aic() {  # unpack bundle c into $AIC; every file checked against the wheel's RECORD sums
  [ -f .carry/c/SHA256SUMS.c ] || { echo "device_setup: no .carry/c here (carry it in this call)" >&2; exit 2; }
  (cd .carry/c && sha256sum -c --quiet ZIP)
  rm -rf "$AIC" "$AIC.tmp"; mkdir -p "$AIC.tmp"
  "$PY" -m zipfile -e ".carry/c/$(awk '{print $2}' .carry/c/ZIP)" "$AIC.tmp"
  (cd "$AIC.tmp" && sha256sum -c --quiet "$OLDPWD/.carry/c/SHA256SUMS.c")
  local listed unpacked
  listed=$(wc -l < .carry/c/SHA256SUMS.c); unpacked=$(find "$AIC.tmp" -type f | wc -l)
  [ "$listed" -eq "$unpacked" ] || { echo "device_setup: bundle c unpacks $unpacked files, lists $listed" >&2; exit 1; }
  touch "$AIC.tmp/.checked"; mv "$AIC.tmp" "$AIC"
  echo "device_setup: aiconfigurator-core in $AIC ($listed files checked); env adds it to PYTHONPATH"
}

case "${1:-}" in
  stage) stage ;;
  install) install ;;
  aic) aic ;;
  env) env_lines ;;
  *) echo "usage: bash tools/device_setup.sh stage|install|aic|env" >&2; exit 2 ;;
esac
