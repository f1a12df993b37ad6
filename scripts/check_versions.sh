#!/usr/bin/env bash
# Run nre_ray on the other tested releases of Ray and MLflow (pyproject.toml's ranges; the default install,
# constraints.txt, is Ray 2.60.0 + MLflow 3.17.2 and is what `make test` runs).
#
#   scripts/check_versions.sh [--build-only] [--steps unit,pipeline,standin] [RAY=MLFLOW ...]
#   make check-versions [ARGS='--steps unit']
#
# For each combination (default: 2.59.0=3.17.2 and 2.60.0=3.16.1) it builds a venv under .versions/ (git-ignored;
# torch==2.13.0 first, kept on every one: an open torch pulls a multi-GB CUDA build), then runs in it:
#   unit      pytest -n 2 tests/unit
#   pipeline  train (1 epoch) -> evaluate -> predict -> serve (/health and one POST /invocations) on the bundled sample
#   standin   python -m nre_ray.standin up, one `ray job submit` training run (1 epoch), status, down
# and prints one line per combination. The result goes to .versions/summary.txt (each step's output in .versions/<combo>.logs/);
# docs/development.md ("Versions") shows the last one.
# CHECK_VERSIONS_LOCK=/tmp/nre_test.lock: each step that starts pytest, Ray or MLflow holds that lock (flock) while
# it runs (a machine shared with other test runs).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
ROOT=$REPO/.versions
TORCH=torch==2.13.0
STEPS=unit,pipeline,standin
BUILD_ONLY=0
COMBOS=()
while [ $# -gt 0 ]; do
  case $1 in
    --build-only) BUILD_ONLY=1 ;;
    --steps) STEPS=$2; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *=*) COMBOS+=("$1") ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ ${#COMBOS[@]} -gt 0 ] || COMBOS=(2.59.0=3.17.2 2.60.0=3.16.1)
for step in ${STEPS//,/ }; do
  case $step in unit|pipeline|standin) ;; *) echo "error: --steps: no step '$step' (unit, pipeline, standin)" >&2; exit 2 ;; esac
done
mkdir -p "$ROOT"

locked() {  # run "$@", holding CHECK_VERSIONS_LOCK if set
  if [ -n "${CHECK_VERSIONS_LOCK:-}" ]; then flock "$CHECK_VERSIONS_LOCK" "$@"; else "$@"; fi
}

build() {  # build <venv> <ray> <mlflow>: the venv with these releases, this project editable, dev extras
  local venv=$1 ray=$2 mlflow=$3 want have
  want=$(printf '%s\n' "$TORCH" "ray==$ray" "mlflow==$mlflow" | cat - pyproject.toml | sha256sum | cut -c1-16)
  have=$(cat "$venv/.installed" 2>/dev/null || true)
  [ "$want" = "$have" ] && return 0
  [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv" || return 1
  printf '%s\n' "$TORCH" "ray==$ray" "mlflow==$mlflow" > "$venv/constraints.txt"
  "$venv/bin/python" -m pip install -q --upgrade pip &&
    "$venv/bin/python" -m pip install -q "$TORCH" &&
    "$venv/bin/python" -m pip install -q -c "$venv/constraints.txt" -e '.[dev]' || return 1
  echo "$want" > "$venv/.installed"
}

free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

step_unit() {  # step_unit <venv>
  locked "$1/bin/python" -m pytest -n 2 -q -p no:cacheprovider tests/unit
}

step_pipeline() (  # step_pipeline <venv> <work>: train -> evaluate -> predict -> serve, in <work> (a subshell)
  local venv=$1 work=$2 py="$1/bin/python" sample=$REPO/nre_ray/data/sample port pid ok=1 model ckpt i
  cd "$work" || return 1
  export NRE_RAY_OWN_RAY=1  # a private local Ray: never join a shared one that another Ray release started
  # each command's failure ends the step (no set -e: it is off inside a function called from an `if`)
  locked "$py" -m nre_ray.train --num-workers 2 --epochs 1 --data-dir "$sample" --summary-json train.json || return 1
  model=$("$py" -c 'import json; print(json.load(open("train.json"))["model_uri"])') || return 1
  ckpt=$("$py" -c 'import json; print(json.load(open("train.json"))["best_checkpoint"])') || return 1
  locked "$py" -m nre_ray.evaluate --model "$ckpt" --data "$sample/test.csv" --num-workers 1 --output metrics.json ||
    return 1
  locked "$py" -m nre_ray.predict --model "$model" --input "$sample/test.csv" --output labelled.csv || return 1
  [ "$(wc -l < labelled.csv)" -gt 1 ] || return 1
  port=$(free_port)
  # its process id in serve.pid (under flock too): Ctrl-C goes to it alone, as a user's would
  (cd "$work" && NRE_RAY_OWN_RAY=1 locked bash -c 'echo $$ > serve.pid; exec "$@"' serve \
     "$py" -m nre_ray.serve --model "$model" --port "$port") &
  pid=$!
  for i in $(seq 1 900); do  # (under a busy lock it waits for it first)
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && { ok=0; break; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  if [ $ok -eq 0 ]; then
    curl -sf "http://127.0.0.1:$port/invocations" -H 'Content-Type: application/json' -d '{"dataframe_split":
      {"columns": ["sentence", "head", "head_offset", "tail", "tail_offset", "head_type", "tail_type"],
       "data": [["Harborview Ltd. and Oakridge Analytics signed a partnership deal in 1985.",
                 "Harborview Ltd.", 0, "Oakridge Analytics", 20, "org", "org"]]}}' | tee "$work/served.json" |
      grep -q predicted_relation || ok=1
    echo
  fi
  # Ctrl-C, as a user stops it: it deletes the application and stops the local Ray it started (status 130)
  [ -s "$work/serve.pid" ] && kill -INT "$(cat "$work/serve.pid")" 2>/dev/null
  wait "$pid"
  echo "serve exited with status $?"
  return $ok
)

step_standin() {  # step_standin <venv> <work>: the rehearsal of docs/cluster.md, on free ports, 1 epoch
  local venv=$1 work=$2
  locked env PATH="$venv/bin:$PATH" VENV_BIN="$venv/bin" DIR="$work/standin" S3="$(free_port)" \
    GCS="$(free_port)" DASH="$(free_port)" MLF="$(free_port)" bash -euo pipefail -c '
    unset RAY_API_SERVER_ADDRESS AWS_ENDPOINT_URL MLFLOW_TRACKING_URI RAY_ADDRESS
    trap "python -m nre_ray.standin --dir $DIR down || true" EXIT
    python -m nre_ray.standin --dir "$DIR" up --s3-port $S3 --gcs-port $GCS --dashboard-port $DASH --mlflow-port $MLF
    source "$DIR/env.sh"
    python -m nre_ray.standin --dir "$DIR" upload nre_ray/data/sample s3://$BUCKET/nre_ray/data
    ray job submit --submission-id versions-1 --working-dir . -- \
      python -m nre_ray.train --num-workers 2 --epochs 1 \
        --storage-path s3://$BUCKET/nre_ray/checkpoints --tracking-uri $TRACKING_URI \
        --data-dir s3://$BUCKET/nre_ray/data
    status=$(ray job status versions-1); echo "$status"  # (not `| tee /dev/stderr`: it reopens this log, truncated)
    grep -q "succeeded" <<< "$status"
    python -m nre_ray.standin --dir "$DIR" status'
}

main() {  # every combination built first, then each step for every combination before the next step (a run cut
          # short has the unit tests of all); one line per combination, into .versions/summary.txt
  local combo ray mlflow name venv logs step t0 t1 r line unit got failed_any=0 ready=() lines=()
  declare -A passed failed secs work
  for combo in "${COMBOS[@]}"; do
    ray=${combo%%=*} mlflow=${combo#*=} name="ray-${combo%%=*}-mlflow-${combo#*=}"
    venv=$ROOT/$name logs=$ROOT/$name.logs
    rm -rf "$logs"; mkdir -p "$logs"
    t0=$(date +%s)
    echo "== $name: building $venv ($TORCH, ray==$ray, mlflow==$mlflow) ..."
    if build "$venv" "$ray" "$mlflow" > "$logs/build.log" 2>&1; then
      got=$("$venv/bin/python" -c 'from importlib.metadata import version as v; print(v("ray"), v("mlflow"), v("torch"))')
      echo "   installed: ray mlflow torch = $got"
      ready+=("$combo") work[$combo]=$(mktemp -d /tmp/nre_versions.XXXXXX)
    else
      failed[$combo]="build"; echo "   build FAILED: $logs/build.log"; tail -5 "$logs/build.log"
    fi
    secs[$combo]=$(( $(date +%s) - t0 ))
  done
  if [ $BUILD_ONLY -eq 0 ]; then
    for step in ${STEPS//,/ }; do
      for combo in "${ready[@]}"; do
        name="ray-${combo%%=*}-mlflow-${combo#*=}" logs=$ROOT/ray-${combo%%=*}-mlflow-${combo#*=}.logs
        echo "== $name: $step ... (log: $logs/$step.log)"
        t0=$(date +%s)
        if "step_$step" "$ROOT/$name" "${work[$combo]}" > "$logs/$step.log" 2>&1; then
          passed[$combo]="${passed[$combo]:-} $step"; r=passed
        else
          failed[$combo]="${failed[$combo]:-} $step"; r=FAILED
        fi
        t1=$(date +%s); secs[$combo]=$(( ${secs[$combo]} + t1 - t0 ))
        echo "   $step $r ($(( t1 - t0 )) s)"
      done
    done
  fi
  for combo in "${COMBOS[@]}"; do
    rm -rf "${work[$combo]:-/nonexistent}"
    set -- ${passed[$combo]:-}; local np=$#; local pl="$*"
    set -- ${failed[$combo]:-}; local nf=$#; local fl="$*"
    [ "$nf" -eq 0 ] || failed_any=1
    line="$(date -u +%Y-%m-%d) ray ${combo%%=*} mlflow ${combo#*=} torch ${TORCH#torch==}: $np passed ($pl), $nf failed ($fl), ${secs[$combo]} s"
    [ $BUILD_ONLY -eq 1 ] && [ "$nf" -eq 0 ] && line="$(date -u +%Y-%m-%d) ray ${combo%%=*} mlflow ${combo#*=}: built, ${secs[$combo]} s"
    unit=$(grep -hE "[0-9]+ (passed|failed)" "$ROOT/ray-${combo%%=*}-mlflow-${combo#*=}.logs/unit.log" 2>/dev/null |
           tail -1 | sed -E 's/^=+ //; s/ =+$//')
    [ -n "$unit" ] && line="$line; unit tests: $unit"
    echo "$line"
    lines+=("$line")
  done
  [ $BUILD_ONLY -eq 1 ] || printf '%s\n' "${lines[@]}" > "$ROOT/summary.txt"
  return $failed_any
}

main; exit $?  # on one line: bash has read the whole file before anything runs (an edit during a run is harmless)
