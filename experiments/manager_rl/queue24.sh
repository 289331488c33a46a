#!/bin/bash
# Round 24 (31st session): one slot of the queue the rebuilt round ran. Pops the next job (arm:seed) from
# $LOGS/r24-jobs and runs it with round24.sh; a scored job waits for the candidate id in $LOGS/r24-manager (written
# once the chain built it), put back at the head of the queue so that the seeds keep their order. With TRANSFER=1
# (33rd session) each job's home then has its last checkpoint evaluated on the transfer set (transfer_last.sh, about
# 2 minutes), logged to $LOGS/r24t-ARM-sS.log. Two of these ran side by side, one per core.
# Usage: [TRANSFER=1] queue24.sh   (LOGS default /work/logs)
cd "$(dirname "$0")/../.."
L=${LOGS:-/work/logs}
while true; do
  job=$(flock "$L/r24-jobs.lock" bash -c "j=\$(head -n 1 $L/r24-jobs); [ -n \"\$j\" ] && sed -i 1d $L/r24-jobs; echo \"\$j\"")
  [ -z "$job" ] && break
  case $job in scored:*) [ -s "$L/r24-manager" ] || {
    echo "$(date -u +%H:%M:%S) no candidate yet for $job"
    flock "$L/r24-jobs.lock" bash -c "{ echo $job; cat $L/r24-jobs; } > $L/r24-jobs.new && mv $L/r24-jobs.new $L/r24-jobs"
    sleep 60; continue; } ;; esac
  echo "$(date -u +%H:%M:%S) start $job"
  MANAGER=$(cat "$L/r24-manager" 2>/dev/null) CANDIDATE_HOME=mgr23b SLOTS=1 experiments/manager_rl/round24.sh "$job"
  echo "$(date -u +%H:%M:%S) end $job"
  if [ -n "${TRANSFER:-}" ]; then
    arm=${job%%:*}; [ "$arm" = scored ] && arm=trained
    experiments/manager_rl/transfer_last.sh "mgr24-$arm-s${job##*:}" > "$L/r24t-${job%%:*}-s${job##*:}.log" 2>&1
    echo "$(date -u +%H:%M:%S) transfer done $job"
  fi
done
