# Shared by the GPU jobs that time OpenAI-compatible servers (serve_job.sh, native_job.sh); sourced, not run.

# Waits until url/health answers (0) or the server process pid has exited (1); at most 5 minutes.
wait_health() {  # url pid
  for _ in $(seq 1 600); do
    curl -sf "$1/health" > /dev/null 2>&1 && return 0
    kill -0 "$2" 2> /dev/null || return 1
    sleep 0.5
  done
  return 1
}

# tools/serve_bench.py against the server at url (process pid) once it is healthy, streams $LEVELS, max_tokens per
# stream; its table rows (or why there are none) appended to file and printed; then the server is stopped.
bench_server() {  # label url pid max_tokens file
  if wait_health "$2" "$3"; then
    python3 tools/serve_bench.py --url "$2" --concurrency "$LEVELS" --max-tokens "$4" --label "$1" | tee -a "$5"
    # The server's own counters after the run (cider's step-time histograms; llama-server answers 501 unless --metrics).
    curl -s "$2/metrics" > "$(dirname "$5")/metrics_$(echo "$1" | tr -c 'A-Za-z0-9_\n' '_').txt" 2> /dev/null
  else
    echo "$1: did not become healthy" | tee -a "$5"
  fi
  kill -TERM "$3" 2> /dev/null
  wait "$3" 2> /dev/null
}
