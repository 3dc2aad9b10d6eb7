#!/usr/bin/env bash
# The whole GPU study from one commit in three device calls started back to back on one warm,
# air-gapped machine (the lent H200's flow; /tmp lives only while the machine stays warm):
#
#   call A, carrying .carry/a .peers [.carry/s]:  bash tools/study_calls.sh A <commit>   # 04 03
#   call B, carrying .carry/b .peers:             bash tools/study_calls.sh B <commit>   # 02
#   call C, carrying .peers:                      bash tools/study_calls.sh C <commit>   # 01 05 06
#
# A installs the notebook toolchain (and the wheels in .carry/s where carried) and stages
# QuACK's bundle a (tools/device_setup.sh stage); B joins bundle b and installs QuACK
# (device_setup.sh install), then runs notebook 02, which needs QuACK; C runs the rest. S is A
# without notebooks (when A's results come from an earlier machine: see .carry/res below).
# <commit> is `git rev-parse --short=12 HEAD` of the clean commit the tree is (every row
# records it: ROPE_STUDY_COMMIT). Each call leaves $OUT/res-<step>.tgz: data/<device>,
# reports/<device> and /tmp/logs as they stand after it (every earlier call's results
# included, kept in /tmp/res between calls). Where a machine was lost between calls, carry
# the last call's results unpacked into .carry/res (git-ignored) in the next call, which
# starts from them, and run S before B on the new machine.
#
# Seen on an H200 (2026-12-03): A ~360 s (04 ~230 s), B ~450 s (QuACK install ~60 s; 02
# compiles every same-bytes copy member per shape before timing it: give B a 590 s limit),
# C ~230 s. The peers' status is logged in A and S only (it imports QuACK's CuTe DSL and
# JIT-builds SGLang's and FlashInfer's kernels: ~2 min on a fresh machine).
set -u
usage() { echo "usage: bash tools/study_calls.sh S|A|B|C <12-hex-digit commit>" >&2; exit 2; }
[ $# -eq 2 ] || usage
step=$1
case $step in S|A|B|C) ;; *) usage ;; esac
[[ $2 =~ ^[0-9a-f]{12}$ ]] || { echo "study_calls: commit must be 12 hex digits (git rev-parse --short=12 HEAD), got '$2'" >&2; exit 2; }
export ROPE_STUDY_COMMIT=$2 PYTHONUNBUFFERED=1 PIP_BREAK_SYSTEM_PACKAGES=1
OUT=${OUT:?study_calls: set OUT, the folder the results are left in}
R=$PWD; L=/tmp/logs; RES=/tmp/res; mkdir -p $L $RES

case $step in
  S|A)
    (cd .carry/a && python3 -m pip install -q --no-index --find-links toolchain $(sed -n 1p TOOLCHAIN) \
       && python3 -m pip install -q --no-index --no-deps --find-links toolchain $(sed -n 2p TOOLCHAIN)) \
       > $L/install-a.log 2>&1 || tail -20 $L/install-a.log
    if [ -d .carry/s ]; then
      python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/s/*.whl >> $L/install-a.log 2>&1 \
        || tail -5 $L/install-a.log
    fi
    bash tools/device_setup.sh stage 2>&1 | tail -2
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used,temperature.gpu --format=csv,noheader;;
  B) bash tools/device_setup.sh install > $L/install-b.log 2>&1; echo "install rc=$?"; tail -3 $L/install-b.log;;
esac
if [ -d .carry/res ]; then cp -r .carry/res/. $RES/; fi
eval "$(bash tools/device_setup.sh env)"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} ROPE_PEERS_DIR=$R/.peers
device=$(python3 -c "from rope_kernels.provenance import device_name, device_slug; print(device_slug(device_name('cuda')))") || exit 1
rm -rf data/$device reports/$device; cp -r $RES/. ./ 2>/dev/null
if [ $step = S ] || [ $step = A ]; then
  python3 -m rope_kernels peers status 2>&1 | grep -E "^[a-z_0-9]+ +(ran|absent)" | cut -c1-220 > $L/peers-$step.txt
  cut -c1-120 $L/peers-$step.txt
fi
case $step in S) nbs="";; A) nbs="04 03";; B) nbs="02";; C) nbs="01 05 06";; esac
for nb in $nbs; do
  s=$(date +%s)
  python3 -m rope_kernels run --device cuda --only $nb > $L/run-$nb.log 2>&1; rc=$?
  echo "== $nb rc=$rc $(( $(date +%s) - s ))s"; tail -3 $L/run-$nb.log
  cp -r --parents data/$device reports/$device $RES/ 2>/dev/null
done
mkdir -p data/$device reports/$device
tar czf $OUT/res-$step.tgz data/$device reports/$device -C /tmp logs
ls -la $OUT
