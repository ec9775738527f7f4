# Sourced by the GPU drivers whose run outlives one device call (a call ends after minutes; the
# machine stays up while calls follow one another). The driver sets BASE, OUT and RUN_OUT,
# defines `run` (which ends by writing "finished" into $RUN_OUT/LOG) and ends with
#   detached_main LOG "$0" "$@"
# Then: `DRIVER run` runs in the foreground; `DRIVER start` runs it in a new process session,
# so it outlives the command that started it; `DRIVER wait SECONDS` waits for a started run
# (at most SECONDS), then archives $RUN_OUT into $OUT/results.tgz with LOG beside it, done or
# not, and prints the log's end.

# h200, h100, ... (gpu if no H card answers): the card that ran, for result file names.
gpu_label() {
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  if [[ $name =~ H([0-9]+) ]]; then echo "h${BASH_REMATCH[1]}"; else echo gpu; fi
}

# The op libraries, built in this tree unless there already (the GPU host's Python builds its
# own: the ones here are ignored by git and never carried).
build_ops_once() {
  ls custom_ops/*.so >/dev/null 2>&1 \
      || "${PY:-python3}" setup.py build_ext --inplace -j 8 > "$RUN_OUT/build.log" 2>&1
}

detached_main() {
  local log_name=$1 script=$2
  shift 2
  case "${1:-run}" in
    run) run ;;
    start)
      rm -rf "$RUN_OUT" && mkdir -p "$RUN_OUT"
      setsid nohup bash "$script" run > "$BASE/run.stdout" 2>&1 < /dev/null &
      echo "started $!" ;;
    wait)
      local deadline=$(( $(date +%s) + ${2:-500} ))
      while [ "$(date +%s)" -lt $deadline ] \
          && ! grep -q "finished" "$RUN_OUT/$log_name" 2>/dev/null; do
        sleep 5
      done
      # One archive (a command's $OUT brings back few files) beside the run's own log.
      mkdir -p "$OUT" && tar czf "$OUT/results.tgz" -C "$RUN_OUT" . \
          && cp "$RUN_OUT/$log_name" "$OUT/" 2>/dev/null
      tail -40 "$RUN_OUT/$log_name" ;;
    *) echo "usage: $script run|start|wait SECONDS" >&2; exit 2 ;;
  esac
}
