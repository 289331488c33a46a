#!/bin/bash
# Round 24 (31st session): one slot of the queue the rebuilt round ran. Pops the next job (arm:seed) from
# $LOGS/r24-jobs and runs it with round24.sh; a scored job waits for the candidate id in $LOGS/r24-manager (written
# once it qualified). Two of these ran side by side, one per core. Usage: queue24.sh   (LOGS default /work/logs)
cd "$(dirname "$0")/../.."
while true; do
  job=$(flock ${LOGS:-/work/logs}/r24-jobs.lock bash -c 'j=$(head -n 1 ${LOGS:-/work/logs}/r24-jobs); [ -n "$j" ] && sed -i 1d ${LOGS:-/work/logs}/r24-jobs; echo "$j"')
  [ -z "$job" ] && break
  echo "$(date -u +%H:%M:%S) start $job"
  case $job in scored:*) [ -s ${LOGS:-/work/logs}/r24-manager ] || { echo "no candidate yet for $job"; echo "$job" >> ${LOGS:-/work/logs}/r24-jobs; sleep 60; continue; } ;; esac
  MANAGER=$(cat ${LOGS:-/work/logs}/r24-manager 2>/dev/null) CANDIDATE_HOME=mgr23b SLOTS=1 experiments/manager_rl/round24.sh "$job"
  echo "$(date -u +%H:%M:%S) end $job"
done
