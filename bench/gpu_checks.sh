#!/usr/bin/env bash
# The GPU checks of the dynamic pass, on a CUDA machine, one after another: each named check runs
# alone with its own time limit (a check that shares the machine with others gives no speed figure
# and may not finish), writes what it finished into $R, and everything is packed into
# $OUT/res.tgz after each check, so a run cut short still hands back the checks before.
#
#   bash bench/gpu_checks.sh CHECK[+CHECK...][=SECONDS] ...   e.g.  adversarial+fixtures=400 timing
#
# Checks joined by + run at the same time under one limit: for checks of behaviour only, never for
# a speed figure.
# Checks: adversarial, fixtures, gputests, timing (spread, then overhead: overhead_off and
# overhead_on), problems (KernelBench level 1 beside the naive check), corpus (80 real kernels cold,
# warm, resumed; corpus_cold and corpus_warm split it), gpu_share, kbx, kbx_timed, kbx_quant,
# cudal1, cudal1_full (one GPU file, resumed over commands and sessions), real8, fk. Corpora are read
# from .corpora/ (bench/corpora.sh makes it from clones of the public repositories; keep it out of
# git with .git/info/exclude); on a machine without kaudit's dependencies, wheels in .whl/ are
# installed first. DEV=cpu runs the same checks on the CPU (to try the script).
# `python bench/gpu_report.py res.tgz` makes the tables; machine.txt samples the machine every 15 s,
# gpu.txt the GPU (busy share, memory used) twice a second.
# A check's remainder after a run cut short: ADV_K (pytest -k for adversarial), FIXTURES (kernel
# files), KBX_DONE (record line numbers already judged). PROBLEM_JOBS: `problems`' -j (default 8);
# CUDAL1_JOBS: `cudal1_full`'s (default 14). CORPUS: the corpus checks' tree (default
# .corpora/real80). CHECK_WORK: what later commands reuse (default build/gpu-checks).
set -u
DEV=${DEV:-cuda}  # DEV=cpu tries the script itself on a machine without a GPU
export PYTHONUNBUFFERED=1 KAUDIT_TEST_DEVICE=$DEV DEV
OUT=${OUT:-/tmp/out}; R=/tmp/res; rm -rf "$R"; mkdir -p "$R" "$OUT"; L=$R/log.txt
if ! python3 -c "import tree_sitter, sarif_om" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  # the source tree as kaudit (its rules/ folder is kaudit.rules)
  ln -sfn ../rules kaudit/rules; export PYTHONPATH=$PWD:/tmp/site
fi
# What later commands on the same machine reuse (kaudit's key, which signs the result and build
# caches; the corpus runs' and cudal1_full's caches) in $W, a folder the repository's .gitignore
# ignores: the device machine keeps those between commands, and removed .kwork, which only this
# checkout's .git/info/exclude ignores (a warm corpus run of the thirteenth session compiled
# everything again). A new command may not keep the home folder either.
export W=${CHECK_WORK:-$PWD/build/gpu-checks}
export XDG_CONFIG_HOME=$W/config
export R L K="python3 -m kaudit scan --dynamic --device $DEV --fail-on never --no-cache -f json"
say() { echo "== $(date +%T) $*" >> "$L"; }
pack() {  # the corpus runs' streams too: a run killed by its limit leaves only those
  cp "$W"/corpus/*.jsonl "$W"/corpus/*.stderr "$R/" 2>/dev/null
  tar czf "$OUT/res.tgz" -C /tmp res 2>/dev/null; cp "$L" "$OUT/log.txt"; }
scan() {  # NAME PATH [options...]: a scan with its stream and report in $R
  local name=$1 path=$2; shift 2
  $K "$path" --build-cache "/tmp/builds-$name" --stream "$R/$name.jsonl" -o "$R/$name.json" "$@"
}
check() {
  case $1 in
    adversarial) python3 -m pytest -v -rfEs -p no:cacheprovider tests/adversarial ${ADV_K:+-k "$ADV_K"} ;;
    gputests) python3 -m pytest -v -rfEs -p no:cacheprovider tests/test_timing.py \
                tests/test_dynamic_probes.py tests/test_attribution.py -k "cuda or gpu or side_stream" ;;
    fixtures)  # as tests/test_dynamic.py judges them: each by its own benchmark's check, the CPU
      # C++ extensions left out on CUDA; FIXTURES: some of them
      local all=${FIXTURES:-fixtures/dynamic/*/kernel.py} cpu="good_cpp_extension|bad_cpp_first_row"
      local own=$(grep -L "^# fixture-tolerance:" $all | grep -Ev "$cpu")
      local fk=$(grep -l "^# fixture-tolerance: fastkernels" $all | grep -Ev "$cpu")
      [ "$DEV" = cpu ] && own="$own $(ls $all | grep -E "$cpu")"
      [ -z "${own// }" ] || scan fixtures $own -j 6
      [ -z "$fk" ] || scan fixtures_fk $fk -j 4 --tolerance fastkernels ;;
    timing) check spread && check overhead ;;
    spread) python3 bench/timing_spread.py --device $DEV --cases good_gelu_triton \
              good_pytorch_linear --repeat 3 --json "$R/spread.json" ;;
    overhead) check overhead_off && check overhead_on ;;
    overhead_off|overhead_on)  # what the sandbox adds (timing off), and what the timing and
      # profile runs add (timing off and on, sandboxed): the three cases in the same command each
      local vary="--timing off --sandbox both"; [ $1 = overhead_on ] && vary="--timing both --sandbox on"
      python3 bench/dynamic_overhead.py --device $DEV --cases good_gelu_triton \
        good_pytorch_linear good_gelu_cuda --repeat 1 $vary --json "$R/$1.json" ;;
    problems) local jobs=${PROBLEM_JOBS:-8}  # PROBLEM_JOBS: its -j
      python3 bench/problems_speed.py .corpora/kb/level1 --device $DEV --jobs $jobs \
        --limit-s $((LIMIT - 20)) --json "$R/problems_l1_j$jobs.json" ;;
    corpus|corpus_cold|corpus_warm)  # cold and warm split over two commands share $W/corpus;
      # CORPUS: another tree of kernels in KernelBench's layout (default the 80 real kernels)
      only=${1#corpus}; python3 bench/dynamic_corpus.py "${CORPUS:-.corpora/real80}" --problems .corpora/kb --device $DEV \
        --jobs 14 --baseline-timings .corpora/a100_baseline.json --limit-s $((LIMIT - 20)) \
        --work "$W/corpus" ${only:+--only ${only#_}} --json "$R/corpus$only.json" ;;
    gpu_share) KB=.corpora/kb/level1; python3 bench/gpu_share.py $KB/1_*.py $KB/2_*.py \
                 $KB/19_*.py $KB/23_*.py --jobs 3 --processes 2 --timeout 240 \
                 --json "$R/gpu_share.json" ;;
    kbx)  # KBX_DONE: line numbers already judged, left blank (the others keep their numbers)
      local corpus=.corpora/kbx/data/kbx_corpus records=all_records.jsonl
      if [ -n "${KBX_DONE:-}" ]; then
        awk -v done=" $KBX_DONE " 'index(done, " " NR " ") && NR > 1 {print ""; next} {print}' \
          $corpus/all_records.jsonl > $corpus/rest.jsonl; records=rest.jsonl
      fi
      scan kbx $corpus/$records -j 8 ;;
    kbx_timed) scan kbx_timed .corpora/kbx/data/timed.jsonl -j 6 ;;
    kbx_quant) python3 -m kaudit problems .corpora/kbx/data/kernelbenchx/Quantization \
                 --device $DEV --seeds 2 -f json --fail-on never -o "$R/kbx_quant.json" ;;
    cudal1) scan cudal1 .corpora/cudal1/h100_sub.json -j 8 ;;
    cudal1_full)  # h100_xsm.json (249 kernels) but the tasks an earlier session audited
      # (bench/results/cudal1_h100_xsm.jsonl): longer than one command, so its result and build
      # caches sit in $W (kept on a warm machine) and the next command resumes
      python3 - .corpora/cudal1/h100_xsm.json bench/results/cudal1_h100_xsm.jsonl <<'PY'
import json, sys
entries, done = sys.argv[1:]
done = {(str(r["level"]), r["task_id"]) for r in map(json.loads, open(done))
        if r.get("status") == "ok"}  # an audit cut short runs again
rest = {level: [e for e in tasks if (level, e["task_id"]) not in done]
        for level, tasks in json.load(open(entries)).items()}
json.dump(rest, open(".corpora/cudal1/h100_rest.json", "w"), indent=1)
PY
      XDG_CACHE_HOME=$W/xdg python3 -m kaudit scan \
        --dynamic --device $DEV --fail-on never -f json .corpora/cudal1/h100_rest.json \
        -j "${CUDAL1_JOBS:-14}" --cache-dir "$W/cudal1-cache" --build-cache "$W/builds-cudal1" \
        --stream "$R/cudal1_full.jsonl" -o "$R/cudal1_full.json" ;;
    real8) scan real8 .corpora/real8 --problems .corpora/kb -j 4 \
             --baseline-timings .corpora/a100_baseline.json ;;
    fk) rm -rf /tmp/fk && mkdir -p /tmp/fk/captures /tmp/fk/fastkernels/tasks/candidate/L1 &&
        cp -r .corpora/fastkernels /tmp/fk/ && cp fixtures/gpu/fastkernels/captures/*.json /tmp/fk/captures/ &&
        cp fixtures/gpu/fastkernels/candidate/L1/*.py /tmp/fk/fastkernels/tasks/candidate/L1/ &&
        scan fk /tmp/fk/fastkernels/tasks/candidate ;;
    *) echo "unknown check $1"; return 2 ;;
  esac
}
export -f check scan say
# what the machine does meanwhile (CPU busy or waiting for the disk, blocks written, compilers
# running, the temporary disk): where a check's time goes when it does not finish
( vmstat 1 1 | sed -n 2p; while :; do echo "$(date +%T) $(vmstat 1 2 | tail -1) compilers=$(
    ps -eo comm | grep -cE '^(cc1plus|cicc|ptxas)$') tmp=$(df --output=used -BG /tmp | tail -1)"
  sleep 15; done ) > "$R/machine.txt" 2>&1 &
WATCH=$!
# the GPU twice a second (busy share, memory used): whether a check's jobs keep it busy
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits \
    -lms 500 > "$R/gpu.txt" 2>&1 &
  WATCH="$WATCH $!"
fi
for spec in "$@"; do
  name=${spec%%=*}; limit=300; [ "$spec" != "$name" ] && limit=${spec#*=}
  say "$name (limit ${limit} s)"; export LIMIT=$limit
  # timeout signals its whole process group: kaudit and its jobs end with the check
  checks=()
  for one in ${name//+/ }; do
    { timeout -k 5 "$limit" bash -c 'check "$0"' "$one" > "$R/$one.txt" 2>&1; say "$one rc $?"; } &
    checks+=($!)
  done
  wait "${checks[@]}"; pack
done
kill $WATCH 2>/dev/null; say end; pack
