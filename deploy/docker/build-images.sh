#!/usr/bin/env bash
# Builds gradmesh's container images with buildah (no Docker engine needed)
# and checks them for real:
#
#   deploy/docker/build-images.sh [--no-build] [--no-check] [--workers P]
#
# 1. scripts/make-base-image.sh: docker.io/library/debian:12, made from the
#    Debian mirror when no registry is reachable.
# 2. buildah bud --layers --target X for X in coordinator, worker, trainer
#    (deploy/docker/Dockerfile) -> gradmesh/X.
# 3. Checks, each in containers of the images (buildah run --isolation
#    chroot, which shares the host's network and /dev/shm):
#    - every binary's --help, the uid (10001), /run/gradmesh writable, no
#      compiler in the images, the labels and health checks in their configs,
#      `import gradmesh` in the trainer image;
#    - a cluster: a coordinator in a container of gradmesh/coordinator, P
#      workers each in its own container of gradmesh/worker, and P training
#      processes each in its own container of gradmesh/trainer, sharing its
#      worker's socket directory (a host directory mounted on /run/gradmesh)
#      and /dev/shm. The trainers run the coordinator's default plan (SparDL,
#      1% density) for a few steps of seeded gradients through the Python
#      SDK, then every rank checks every rank's files: the same result
#      everywhere, and inputs = result + residuals (nothing lost). Also the
#      health services (`gradmesh health`, live and ready) and /metrics of
#      every daemon, and that SIGTERM stops each daemon cleanly (status 0).
#
# Prints what it does and the time of each step; exits non-zero on any
# failure; removes its containers and files on every exit path.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
prefix=gradmesh
targets=(coordinator worker trainer)
build=1
check=1
workers=2
steps=3
n=100000

usage() {
  cat <<EOF
usage: deploy/docker/build-images.sh [--no-build] [--no-check] [--workers P]
                                     [--steps T] [--n N]

Builds the images $prefix/coordinator, $prefix/worker and $prefix/trainer
from deploy/docker/Dockerfile with buildah (cached: --layers), after making
the base image debian:12 if it is missing (scripts/make-base-image.sh), then
checks them in buildah containers: the binaries, the users, and a cluster of
one coordinator container, P worker containers and P trainer containers
driving checked all-reduces through the Python SDK.

  --no-build    only check the images already built
  --no-check    only build
  --workers P   workers (and trainers) of the cluster check (default $workers)
  --steps T     all-reduce steps the trainers run (default $steps)
  --n N         values per gradient (default $n)
  -h, --help    this text

Needs root, buildah, podman and debootstrap (apt-get install -y buildah
podman debootstrap). The daemons of the check listen on 127.0.0.1 only, on
ports the system picks (and health ports found free from 27709 on).
EOF
}

die() { echo "build-images: error: $*" >&2; exit 1; }
log() { echo "build-images: $*"; }

while (($#)); do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --no-build) build=0 ;;
    --no-check) check=0 ;;
    --workers) (($# > 1)) || die "--workers needs a value"; workers=$2; shift ;;
    --workers=*) workers=${1#*=} ;;
    --steps) (($# > 1)) || die "--steps needs a value"; steps=$2; shift ;;
    --steps=*) steps=${1#*=} ;;
    --n) (($# > 1)) || die "--n needs a value"; n=$2; shift ;;
    --n=*) n=${1#*=} ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
  shift
done
if ! [[ $workers =~ ^[0-9]+$ ]] || ((workers < 1 || workers > 16)); then
  die "--workers=$workers is not in 1..16"
fi
if ! [[ $steps =~ ^[0-9]+$ ]] || ((steps < 1)); then
  die "--steps=$steps is not positive"
fi
if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 2)); then
  die "--n=$n is less than 2"
fi
[[ $(id -u) -eq 0 ]] || die "needs root (buildah run --isolation chroot)"
command -v buildah >/dev/null || die "buildah is not installed (apt-get install -y buildah)"

# ---- what to undo on exit ----------------------------------------------------
containers=()   # buildah containers to remove
pids=()         # background `buildah run` processes to stop
declare -A daemon_pid=() bg_pid=()  # by name: the daemon's host pid, its buildah run
work=""         # scratch directory
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  local p
  # The processes in the containers first (buildah run kills its process
  # without a signal it can handle), then the `buildah run`s themselves.
  for p in "${daemon_pid[@]}"; do
    kill -TERM "$p" 2>/dev/null || true
  done
  for p in "${pids[@]}"; do
    kill -TERM "$p" 2>/dev/null || true
  done
  for p in "${pids[@]}"; do
    wait "$p" 2>/dev/null || true
  done
  if ((${#containers[@]})); then
    buildah rm "${containers[@]}" >/dev/null 2>&1 || true
  fi
  if [[ -n $work ]]; then
    rm -rf "$work"
  fi
  if ((status != 0)); then
    echo "build-images: FAILED (status $status)" >&2
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

timings=()
timed() {  # timed LABEL COMMAND...: runs it, records its wall time
  local label=$1 start=$SECONDS
  shift
  "$@"
  timings+=("$(printf '%-52s %5d s' "$label" $((SECONDS - start)))")
}

new_container() {  # new_container IMAGE VAR: a container of IMAGE, in VAR
  local _container
  _container=$(buildah from --pull=never --quiet "$1") ||
    die "buildah from $1 failed"
  containers+=("$_container")
  printf -v "$2" '%s' "$_container"
}

forget_pid() {  # forget_pid PID: it has been waited for
  local p kept=()
  for p in "${pids[@]}"; do [[ $p == "$1" ]] || kept+=("$p"); done
  pids=("${kept[@]}")
}

cd "$repo"

# ---- build ---------------------------------------------------------------
build_image() {
  local target=$1
  log "buildah bud --target $target -t $prefix/$target"
  buildah bud --pull=never --isolation chroot --layers --format docker \
    --build-arg "REVISION=$revision" --build-arg "CREATED=$created" \
    --target "$target" -t "$prefix/$target" -f deploy/docker/Dockerfile . ||
    die "building $prefix/$target failed"
}

if ((build)); then
  timed "base image (make-base-image.sh)" scripts/make-base-image.sh
  revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
  if [[ $revision != unknown && -n $(git status --porcelain 2>/dev/null) ]]; then
    revision+="-dirty"
  fi
  created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for t in "${targets[@]}"; do
    timed "build $prefix/$t" build_image "$t"
  done
fi

if ((!check)); then
  printf '%s\n' "${timings[@]}"
  exit 0
fi

# ---- static checks: each image's binaries, user, config ------------------
expect_in() {  # expect_in TEXT PATTERN WHAT
  grep -q -- "$2" <<<"$1" || die "$3: expected '$2' in: $1"
}

check_image() {
  local target=$1 c out
  local image=$prefix/$target
  buildah inspect --type image "$image" >/dev/null 2>&1 ||
    die "no image $image (build it first)"
  log "checking $image"
  new_container "$image" c
  # The CLI, and the binaries each image holds.
  out=$(buildah run --isolation chroot "$c" -- gradmesh --help 2>&1) ||
    die "$image: gradmesh --help failed: $out"
  expect_in "$out" "usage: gradmesh <command>" "$image: gradmesh --help"
  local bins=()
  case $target in
    coordinator) bins=(gradmesh-coordinator) ;;
    worker|trainer) bins=(gradmesh-worker) ;;
  esac
  local b
  for b in "${bins[@]}"; do
    out=$(buildah run --isolation chroot "$c" -- "$b" --help 2>&1) ||
      die "$image: $b --help failed: $out"
    expect_in "$out" "SOME_FLAG" "$image: $b --help"
    expect_in "$out" "--health-listen=" "$image: $b --help"
  done
  # shellcheck disable=SC2016  # $t expands in the container's shell
  out=$(buildah run --isolation chroot "$c" -- sh -c \
    'id -u; touch /run/gradmesh/probe && rm /run/gradmesh/probe && echo run-writable;
     for t in cc c++ gcc g++ cmake ninja make; do command -v $t; done; true' 2>&1) ||
    die "$image: user check failed: $out"
  expect_in "$out" "^10001$" "$image: uid"
  expect_in "$out" "run-writable" "$image: /run/gradmesh"
  if grep -q '^/' <<<"$out"; then
    die "$image: build tools in the runtime image: $(grep '^/' <<<"$out" | tr '\n' ' ')"
  fi
  local config
  config=$(buildah inspect --type image --format \
    '{{.Docker.Config.Healthcheck}} {{.Docker.Config.ExposedPorts}} {{.Docker.Config.Labels}}' \
    "$image")
  expect_in "$config" "org.opencontainers.image.title:gradmesh-$target" "$image: labels"
  case $target in
    coordinator)
      expect_in "$config" "gradmesh health --address=127.0.0.1:7709" "$image: HEALTHCHECK"
      expect_in "$config" "7700/tcp" "$image: EXPOSE" ;;
    worker)
      expect_in "$config" "gradmesh health --address=127.0.0.1:7709" "$image: HEALTHCHECK"
      expect_in "$config" "7701/tcp" "$image: EXPOSE" ;;
    trainer)
      out=$(buildah run --isolation chroot "$c" -- python3 -c \
        'import gradmesh, gradmesh.torch, numpy, torch
print("gradmesh", gradmesh.__file__, "numpy", numpy.__version__, "torch", torch.__version__)' 2>&1) ||
        die "$image: import gradmesh failed: $out"
      log "  $out"
      # What deploy/k8s/examples/fashion-mnist runs.
      out=$(buildah run --isolation chroot "$c" -- python3 \
        /usr/share/gradmesh/examples/fashion_mnist.py --help 2>&1) ||
        die "$image: the example does not start: $out"
      buildah run --isolation chroot "$c" -- \
        test -s /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ||
        die "$image: no Fashion-MNIST" ;;
  esac
  log "  $image: --help, uid 10001, /run/gradmesh, no compilers, config: ok"
}

for t in "${targets[@]}"; do
  timed "check $prefix/$t (binaries, user, config)" check_image "$t"
done

# ---- the cluster check -----------------------------------------------------
work=$(mktemp -d /tmp/gradmesh-images.XXXXXX)
chmod 0755 "$work"

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
next_port=27709
free_port() {  # free_port VAR: the next free port from $next_port
  while ! port_free "$next_port"; do next_port=$((next_port + 1)); done
  printf -v "$1" '%s' "$next_port"
  next_port=$((next_port + 1))
}

wait_file() {  # wait_file PATH SECONDS WHAT PID
  local deadline=$((SECONDS + $2))
  until [[ -s $1 ]]; do
    kill -0 "$4" 2>/dev/null || die "$3 exited early; its log: $(tail -n 20 "$work/$3.log")"
    ((SECONDS < deadline)) || die "$3: no $1 after $2 s; its log: $(tail -n 20 "$work/$3.log")"
    sleep 0.2
  done
}

# wait_bounded PID SECONDS: wait's status, or 124 when PID still runs
# SECONDS later; then it gets SIGTERM (buildah run ends its command on it),
# and SIGKILL 5 s after that.
wait_bounded() {
  local pid=$1 deadline=$((SECONDS + $2))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + 5))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    return 124
  fi
  wait "$pid"
}

http_get() {  # http_get PORT PATH: the response body of GET on 127.0.0.1
  local body
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
  body=$(timeout 10 cat <&3)
  exec 3<&-
  printf '%s' "$body"
}

# health CONTAINER PORT [SERVICE] [SECONDS]: `gradmesh health` in the
# container (the images' HEALTHCHECK command, on this port), until it passes.
health() {
  local c=$1 port=$2 service=${3:-} wait=${4:-30} out
  local deadline=$((SECONDS + wait))
  while :; do
    if out=$(buildah run --isolation chroot "$c" -- gradmesh health \
        "--address=127.0.0.1:$port" "--service=$service" 2>&1); then
      log "  $out"
      return 0
    fi
    ((SECONDS < deadline)) || die "gradmesh health --address=127.0.0.1:$port --service=$service: $out"
    sleep 0.5
  done
}

# start NAME CONTAINER RUNDIR COMMAND...: runs COMMAND in the container in the
# background, RUNDIR mounted on /run/gradmesh; its host pid (no PID namespace
# with chroot isolation) lands in RUNDIR/pid, its output in $work/NAME.log.
start() {
  local name=$1 c=$2 dir=$3
  shift 3
  log "  $name: $*"
  buildah run --isolation chroot -v "$dir:/run/gradmesh" "$c" -- \
    sh -c 'echo $$ > /run/gradmesh/pid; exec "$@"' sh "$@" \
    </dev/null >"$work/$name.log" 2>&1 &
  bg_pid[$name]=$!
  pids+=("$!")
  wait_file "$dir/pid" 30 "$name" "${bg_pid[$name]}"
  daemon_pid[$name]=$(<"$dir/pid")
}

# stop NAME: SIGTERM to the daemon itself (buildah run does not forward it),
# then its exit status must be 0 (a clean shutdown).
stop() {
  local name=$1 status=0
  kill -TERM "${daemon_pid[$name]}" 2>/dev/null || true
  wait_bounded "${bg_pid[$name]}" 30 || status=$?
  forget_pid "${bg_pid[$name]}"
  # On failure the daemon stays known, so that the exit trap kills it.
  ((status == 0)) || die "$name exited with status $status after SIGTERM (124: still running 30 s later); its log: $(tail -n 20 "$work/$name.log")"
  unset 'daemon_pid[$name]'
  log "  $name stopped cleanly"
}

# The trainers' program: seeded gradients through the SDK, then every rank
# checks every rank's results and residuals (as `gradmesh local` does).
mkdir -p "$work/check/out"
cat >"$work/check/trainer.py" <<'EOF'
import os
import pathlib
import sys
import time

import numpy as np

import gradmesh

out = pathlib.Path(os.environ["CHECK_OUT"])
world = int(os.environ["CHECK_WORLD_SIZE"])
n = int(os.environ["CHECK_N"])
steps = int(os.environ["CHECK_STEPS"])

client = gradmesh.init(timeout=60)  # $GRADMESH_WORKER: the unix socket
deadline = time.monotonic() + 60
while (plan := client.plan()).world_size != world:
    if time.monotonic() > deadline:
        sys.exit(f"the view holds {plan.world_size} workers, not {world}")
    time.sleep(0.2)
half = n // 2
tensor_set = client.register("check", [("a", half), ("b", n - half)])
values = tensor_set.values()
rank, size = client.rank, client.size
for step in range(steps):
    gradient = np.random.default_rng([step, rank]).standard_normal(n)
    values[:] = gradient.astype(np.float32)
    np.save(out / f"s{step}.r{rank}.input.npy", values)
    info = client.allreduce_async(tensor_set, step, "sum", sparse=False,
                                  return_residual=True).wait()
    np.save(out / f"s{step}.r{rank}.result.npy", values)
    np.save(out / f"s{step}.r{rank}.residual.npy", tensor_set.residual())
    print(f"rank {rank}/{size} step {step}: {info.algorithm} d={info.teams} "
          f"nonzeros={info.nonzeros} {info.seconds * 1e3:.1f} ms "
          f"sent={info.bytes_sent} B")
client.barrier()  # every rank's files are written

before = [np.zeros(n) for _ in range(size)]
for step in range(steps):
    load = lambda r, what: np.load(out / f"s{step}.r{r}.{what}.npy")
    results = [load(r, "result") for r in range(size)]
    for r in range(1, size):
        if not np.array_equal(results[0], results[r]):
            sys.exit(f"step {step}: rank {r}'s result differs from rank 0's")
    after = [load(r, "residual").astype(np.float64) for r in range(size)]
    pushed = [load(r, "input").astype(np.float64) + before[r]
              for r in range(size)]
    inputs, scale = sum(pushed), sum(np.abs(p) for p in pushed)
    output = results[0].astype(np.float64) + sum(after)
    error = np.abs(output - inputs)
    worst = int(np.argmax(error - 1e-5 * scale))
    if error[worst] > 1e-5 * scale[worst] + 1e-30:
        sys.exit(f"step {step}: mass not conserved at {worst}: inputs "
                 f"{inputs[worst]}, result + residuals {output[worst]}")
    nonzeros = int(np.count_nonzero(results[0]))
    if not 0 < nonzeros <= n:
        sys.exit(f"step {step}: {nonzeros} nonzero results")
    before = after
print(f"rank {rank}: {steps} steps checked: {size} ranks, the same result "
      f"everywhere, inputs = result + residuals")
gradmesh.shutdown()
EOF

cluster_check() {
  local cc addr metrics h
  log "cluster: 1 coordinator, $workers workers, $workers trainers, each in its own container"
  # Coordinator: the image's defaults (0.0.0.0:7700, ...) overridden to
  # 127.0.0.1 and free ports: buildah run shares the host's network.
  mkdir -p "$work/coordinator"
  chown 10001:10001 "$work/coordinator"
  chmod 0700 "$work/coordinator"
  new_container "$prefix/coordinator" cc
  free_port h
  start coordinator "$cc" "$work/coordinator" gradmesh-coordinator \
    --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
    "--health_listen=127.0.0.1:$h" --port_file=/run/gradmesh/port
  wait_file "$work/coordinator/port" 30 coordinator "${bg_pid[coordinator]}"
  read -r addr metrics <"$work/coordinator/port"
  log "  coordinator at $addr, /metrics on $metrics, health on $h"
  health "$cc" "$h"
  local coordinator_addr=$addr coordinator_metrics=$metrics

  local i wc tc
  local worker_containers=() worker_health=() worker_metrics=()
  for ((i = 0; i < workers; i++)); do
    local dir=$work/worker-$i
    mkdir -p "$dir"
    chown 10001:10001 "$dir"
    chmod 0700 "$dir"
    new_container "$prefix/worker" wc
    worker_containers+=("$wc")
    free_port h
    worker_health+=("$h")
    # The SDK socket: the image's default, /run/gradmesh/worker.sock.
    start "worker-$i" "$wc" "$dir" gradmesh-worker \
      "--coordinator=$coordinator_addr" --listen=127.0.0.1:0 \
      --sdk_listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
      "--health_listen=127.0.0.1:$h" "--node_id=worker-$i" \
      --port_file=/run/gradmesh/port
  done
  for ((i = 0; i < workers; i++)); do
    wait_file "$work/worker-$i/port" 30 "worker-$i" "${bg_pid[worker-$i]}"
    read -r addr metrics <"$work/worker-$i/port"
    worker_metrics+=("$metrics")
    [[ -S $work/worker-$i/worker.sock ]] || die "worker-$i: no socket $work/worker-$i/worker.sock"
    log "  worker-$i at $addr, /metrics on $metrics, health on ${worker_health[i]}, SDK on unix:/run/gradmesh/worker.sock"
    health "${worker_containers[i]}" "${worker_health[i]}" "" 30
    health "${worker_containers[i]}" "${worker_health[i]}" ready 30
  done

  # Trainers: one per worker, each in a container of the trainer image with
  # its worker's socket directory on /run/gradmesh (the image's
  # GRADMESH_WORKER) and the host's /dev/shm (chroot isolation shares it).
  chown -R 10001:10001 "$work/check/out"
  local trainer_pids=()
  for ((i = 0; i < workers; i++)); do
    new_container "$prefix/trainer" tc
    log "  trainer-$i: python3 trainer.py (GRADMESH_WORKER=unix:/run/gradmesh/worker.sock of worker-$i)"
    buildah run --isolation chroot \
      -v "$work/worker-$i:/run/gradmesh" -v "$work/check:/check" \
      --env GRADMESH_JOB=image-check --env CHECK_OUT=/check/out \
      --env "CHECK_WORLD_SIZE=$workers" --env "CHECK_N=$n" \
      --env "CHECK_STEPS=$steps" \
      "$tc" -- python3 /check/trainer.py </dev/null >"$work/trainer-$i.log" 2>&1 &
    trainer_pids+=("$!")
    pids+=("$!")
  done
  local failed=0 deadline=$((SECONDS + 300))  # for all the trainers
  for ((i = 0; i < workers; i++)); do
    if ! wait_bounded "${trainer_pids[i]}" $((deadline > SECONDS ? deadline - SECONDS : 1)); then
      failed=1
    fi
    forget_pid "${trainer_pids[i]}"
    sed "s/^/build-images:   trainer-$i| /" "$work/trainer-$i.log"
  done
  ((!failed)) || die "a trainer failed (logs above)"
  for ((i = 0; i < workers; i++)); do
    grep -q "steps checked" "$work/trainer-$i.log" || die "trainer-$i did not check its results"
  done

  # /metrics of every daemon, on the host (the same network).
  local body
  body=$(http_get "$coordinator_metrics" /metrics) || die "coordinator /metrics unreachable"
  expect_in "$body" "^gradmesh_" "coordinator /metrics"
  for ((i = 0; i < workers; i++)); do
    body=$(http_get "${worker_metrics[i]}" /metrics) || die "worker-$i /metrics unreachable"
    expect_in "$body" "^gradmesh_" "worker-$i /metrics"
  done
  log "  /metrics of the coordinator and of $workers workers: ok"

  for ((i = 0; i < workers; i++)); do stop "worker-$i"; done
  stop coordinator
}

timed "check: cluster of containers + trainers" cluster_check

log "images:"
buildah images --format '{{.Name}}:{{.Tag}} {{.ID}} {{.Size}}' |
  grep -E "^(localhost/)?$prefix/|debian" | sed 's/^/build-images:   /' || true
log "timings:"
printf 'build-images:   %s\n' "${timings[@]}"
log "all checks passed"
