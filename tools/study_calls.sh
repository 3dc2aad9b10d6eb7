#!/usr/bin/env bash
# The whole GPU study from one commit in three device calls started back to back on one warm,
# air-gapped machine (the lent H200's flow; /tmp lives only while the machine stays warm):
#
#   call A, carrying .carry/a .peers [.carry/s]:  bash tools/study_calls.sh A <commit>   # 03
#   call B, carrying .carry/b .peers:             bash tools/study_calls.sh B <commit>   # 02
#   call C, carrying .carry/c .peers:             bash tools/study_calls.sh C <commit>   # 04 01 05 06
#   call W (only if C's notebooks outlast it):    bash tools/study_calls.sh W <commit>
#
# A installs the notebook toolchain (and the wheels in .carry/s where carried) and stages
# QuACK's bundle a (tools/device_setup.sh stage); B joins bundle b and installs QuACK
# (device_setup.sh install), then runs notebook 02, which needs QuACK; C runs the rest (04 and
# 05 time our CuTe DSL kernel, whose nvidia-cutlass-dsl comes with QuACK's bundle: after B), after
# unpacking bundle c (aiconfigurator-core 0.12.0 with the H100's and H200's tables only, every file checked
# against the wheel's RECORD: tools/device_setup.sh aic) so 04's prefill comes from
# aiconfigurator's tables (without .carry/c, 04 falls back to the hand model and says so). S is A
# without notebooks (when A's results come from an earlier machine: see .carry/res below).
# STUDY_ARGS (optional): extra arguments for every notebook's `rope_kernels run` (e.g. a shorter
# profile for the device time left: -p 04_ttft.resolutions=[1024x1024], or the trimmed overlay
# --params params/cuda-short.yaml, about 1,100 s of device time for all six notebooks by its own
# estimate); the executed notebooks (reports) record them.
# <commit> is `git rev-parse --short=12 HEAD` of the clean commit the tree is (every row
# records it: ROPE_STUDY_COMMIT).
#
# The notebooks run in a copy of the tree (/tmp/work), in their own process session, so a
# notebook that outlasts its call is not killed with it: the call returns at CALL_LIMIT
# seconds (default 560) after its start, saying what still runs, and the next call waits for
# it before doing its own (step W only waits and returns the results). The machine still goes
# back when no call comes for a while (about 30 s on the lent H200): start the next call at
# once. Finished notebooks' data and reports are kept in /tmp/res; every call leaves
# $OUT/res-<step>.tgz with data/<device>, reports/<device> as /tmp/res holds them and the
# logs. Where a machine was lost between calls, carry the last results unpacked into
# .carry/res (git-ignored): the next call starts from them (run S before B on a new machine,
# and carry .carry/res in B: .carry/a, .carry/s, .peers and .carry/res together pass the
# 64 MiB a call carries).
#
# Seen on an H200 (2026-12-04, 38172a32b6ba): A 329 s (04 216 s, 03 27 s), S 123 s, B 389 s
# (QuACK install ~25 s, 02 364 s), C 249 s (01 99 s, 05 129 s, 06 15 s). The peers' status is
# logged in A and S only (it imports QuACK's CuTe DSL and JIT-builds SGLang's and
# FlashInfer's kernels: ~2 min on a fresh machine).
set -u
START=$(date +%s)
usage() { echo "usage: bash tools/study_calls.sh S|A|B|C|W <12-hex-digit commit>" >&2; exit 2; }
[ $# -eq 2 ] || usage
step=$1
case $step in S|A|B|C|W) ;; *) usage ;; esac
[[ $2 =~ ^[0-9a-f]{12}$ ]] || { echo "study_calls: commit must be 12 hex digits (git rev-parse --short=12 HEAD), got '$2'" >&2; exit 2; }
OUT=${OUT:?study_calls: set OUT, the folder the results are left in}
LIMIT=${CALL_LIMIT:-560}
export ROPE_STUDY_COMMIT=$2 PYTHONUNBUFFERED=1 PIP_BREAK_SYSTEM_PACKAGES=1
R=$PWD; L=/tmp/logs; RES=/tmp/res; WORK=/tmp/work; JOB=$L/job
mkdir -p $L $RES

# wait for the notebooks an earlier call left running (up to this call's limit)
job_alive() { [ -f $JOB.running ] && kill -0 "$(cat $JOB.pid 2>/dev/null)" 2>/dev/null; }
wait_job() {
  while job_alive && [ $(( $(date +%s) - START )) -lt $LIMIT ]; do sleep 1; done
  if [ -f $JOB.running ] && ! job_alive; then  # ended without clearing its mark: it was killed
    echo "study_calls: the job '$(cat $JOB.running)' ended without finishing" | tee -a $L/done.txt
    rm -f $JOB.running
  fi
  ! job_alive
}
leave() {  # results so far, then return
  cat $L/done.txt 2>/dev/null  # every notebook finished so far, with its rc and seconds
  tar czf $OUT/res-$step.tgz -C $RES . -C /tmp logs 2>/dev/null
  ls -la $OUT; exit "${1:-0}"
}
if ! wait_job; then echo "study_calls: $(cat $JOB.running) still running; call again"; leave 3; fi

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
  C) bash tools/device_setup.sh aic > $L/install-c.log 2>&1; echo "aic rc=$?"; tail -3 $L/install-c.log;;
esac
if [ -d .carry/res ]; then cp -r .carry/res/. $RES/; fi
eval "$(bash tools/device_setup.sh env)"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} ROPE_PEERS_DIR=$WORK/.peers
export PYTHONPATH=$WORK:${PYTHONPATH#$R:}  # the copy's package, not the call's tree
[ $step = W ] && leave 0

# a fresh copy of the tree (no bundles) where everything runs (the peers' JIT builds too, so
# the status below warms the notebooks' caches); the notebooks in the background
rm -rf $WORK; mkdir -p $WORK
tar cf - --exclude=./.carry --exclude=./.git . | tar xf - -C $WORK
cd $WORK
# STUDY_PEERS_STATUS=0 skips the peers' status (about 2 min on a fresh machine; the notebooks
# build what they run anyway) where device time is short
if { [ $step = S ] || [ $step = A ]; } && [ "${STUDY_PEERS_STATUS:-1}" != 0 ]; then
  python3 -m rope_kernels peers status 2>&1 | grep -E "^[a-z_0-9]+ +(ran|absent)" | cut -c1-220 > $L/peers-$step.txt
  cut -c1-120 $L/peers-$step.txt
fi
# STUDY_PREFLIGHT (optional): a short check of the GPU code paths before this call's notebooks
# (e.g. "python3 -m pytest -q -x tests/test_gpu.py"), in the copy, at most PREFLIGHT_LIMIT
# seconds (default 120); its tail is printed and its log returned, and the notebooks run after
# it either way (the printout says whether to stop the run)
if [ -n "${STUDY_PREFLIGHT:-}" ]; then
  timeout "${PREFLIGHT_LIMIT:-120}" bash -c "$STUDY_PREFLIGHT" > $L/preflight-$step.log 2>&1
  echo "preflight rc=$? ($STUDY_PREFLIGHT)"; tail -15 $L/preflight-$step.log | cut -c1-300
fi
case $step in S) nbs="";; A) nbs="03";; B) nbs="02";; C) nbs="04 01 05 06";; esac
# STUDY_NOTEBOOKS (optional): this call's notebooks instead of its step's (an order that puts
# first what matters most when device time is short, e.g. "04 05" in C, then "01 06")
[ $step = S ] || nbs=${STUDY_NOTEBOOKS:-$nbs}
[ -n "$nbs" ] || leave 0
device=$(python3 -c "from rope_kernels.provenance import device_name, device_slug; print(device_slug(device_name('cuda')))") || leave 1
echo "$nbs (call $step)" > $JOB.running
setsid bash -c "
  cd $WORK && rm -rf data/$device reports/$device && cp -r $RES/. ./ 2>/dev/null
  for nb in $nbs; do s=\$(date +%s)
    python3 -m rope_kernels run --device cuda --only \$nb ${STUDY_ARGS:-} > $L/run-\$nb.log 2>&1
    echo \"== \$nb rc=\$? \$(( \$(date +%s) - s ))s\" >> $L/done.txt
    cp -r --parents data/$device reports/$device $RES/ 2>/dev/null
  done
  rm -f $JOB.running" < /dev/null > $L/job-$step.log 2>&1 &
echo $! > $JOB.pid
if wait_job; then leave 0; fi
echo "study_calls: $(cat $JOB.running) still running at ${LIMIT}s; the next call (W: only wait) waits for it"
leave 0
