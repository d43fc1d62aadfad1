#!/usr/bin/env bash
# Two Kafka clients' read-process-write ceilings side by side: librdkafka (onceflow's own
# ceiling client, built on onceflow's vendor/) and krafka (pure Rust). One broker (the project's), RECORDS preloaded
# 1 KiB records without a key (Kafka's ProducerPerformance) in PARTITIONS partitions; then
# ROUNDS rounds, the two clients in alternating order, each run reading the whole input from
# its beginning and writing it to a fresh output topic. Ratios krafka / rdkafka are taken
# within a round and reported as the median with their min-max (paired).
#
#   benches/client-ceiling/run.sh [records] [partitions] [rounds] [krafka|krafka-1]
#                                                          (2000000 8 4 krafka)
#
# krafka runs on Tokio's multi-threaded runtime, krafka-1 on its current-thread one;
# FETCH_MAX_BYTES sets krafka's consumer fetch limit (50 MiB by default, as librdkafka's).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
kafka="$root/scripts/kafka"
records="${1:-2000000}"
partitions="${2:-8}"
rounds="${3:-4}"
other="${4:-krafka}"
(cd "$root" && cargo build --release --quiet -p client-ceiling)
bin="${CARGO_TARGET_DIR:-$root/target}/release/client-ceiling"
bootstrap="$("$kafka" start)"
trap '"$kafka" stop' EXIT
id="$(date +%s)"
input="client-ceiling-in-$id"
"$kafka" topics --bootstrap-server "$bootstrap" --create --topic "$input" --partitions "$partitions" >/dev/null
echo "preloading $records x 1 KiB records into $partitions partition(s)..." >&2
"$kafka" tool org.apache.kafka.tools.ProducerPerformance --topic "$input" --num-records "$records" \
  --record-size 1024 --throughput -1 \
  --producer-props "bootstrap.servers=$bootstrap" acks=all linger.ms=5 batch.size=262144 >/dev/null
run() { # client round -> "client records seconds cpu-s records/s cpu-us/record"
  local out="client-ceiling-$1-$2-$id"
  "$kafka" topics --bootstrap-server "$bootstrap" --create --topic "$out" --partitions "$partitions" >/dev/null
  "$bin" "$1" "$bootstrap" "$input" "$partitions" "$out" "$records"
  "$kafka" topics --bootstrap-server "$bootstrap" --delete --topic "$out" >/dev/null
}
echo "$records records, $partitions partition(s), one broker, rdkafka against $other, FETCH_MAX_BYTES ${FETCH_MAX_BYTES:-default}; an unmeasured warm-up of each client first"
run rdkafka 0 >/dev/null
run "$other" 0 >/dev/null
echo
echo "| round | rdkafka records/s | $other records/s | rdkafka CPU µs/record | $other CPU µs/record | $other / rdkafka records/s | $other / rdkafka CPU per record |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
rates=(); cpus=()
for round in $(seq 1 "$rounds"); do
  if (( round % 2 )); then a="$(run rdkafka "$round")"; b="$(run "$other" "$round")"
  else b="$(run "$other" "$round")"; a="$(run rdkafka "$round")"; fi
  read -r _ _ _ _ ar ac <<<"$a"
  read -r _ _ _ _ br bc <<<"$b"
  rr="$(awk -v a="$ar" -v b="$br" 'BEGIN { printf "%.2f", b / a }')"
  cr="$(awk -v a="$ac" -v b="$bc" 'BEGIN { printf "%.2f", b / a }')"
  rates+=("$rr"); cpus+=("$cr")
  echo "| $round | $ar | $br | $ac | $bc | $rr | $cr |"
done
summary() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END {
  m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
  printf "%.2f (%.2f-%.2f)\n", m, v[1], v[NR] }'; }
echo
echo "$other / rdkafka records/s:       $(summary "${rates[@]}")"
echo "$other / rdkafka CPU per record:  $(summary "${cpus[@]}")"
