# The watchdog of a throwaway test cluster (see throwaway.rs): stops the
# cluster and removes its directory once the test run that started it is
# over. Runs as the cluster's owner, detached from the test process.
#
# Arguments: the cluster directory, the pid of the run (the test
# processes' parent: cargo or nextest), the seconds of idleness after
# which the cluster stops even though the run goes on, the lock file test
# processes register under, and pg_ctl.
dir=$1 run=$2 idle=$3 lock=$4 pg_ctl=$5

# Whether process $1 runs. A zombie does not (orphans wait for init to
# reap them). Without /proc, kill -0 tells, for processes of our own.
alive() {
  if [ -d /proc/self ]; then
    line=
    read -r line 2>/dev/null <"/proc/$1/stat" || return 1
    state=${line##*) }
    [ "${state%% *}" != Z ]
  else
    kill -0 "$1" 2>/dev/null
  fi
}

# Whether a registered test process still runs; forgets the dead ones.
in_use() {
  used=1
  for f in "$dir"/users/*; do
    [ -e "$f" ] || continue
    if alive "${f##*/}"; then used=0; else rm -f "$f"; fi
  done
  return $used
}

quiet=0
# A directory gone means the test process that created it failed to start
# the cluster and cleaned up itself.
while sleep 1 && [ -d "$dir" ]; do
  if in_use; then quiet=0; else quiet=$((quiet + 1)); fi
  if alive "$run" && [ "$quiet" -lt "$idle" ]; then
    continue
  fi
  # Decide under the test processes' lock, so that none registers with a
  # cluster about to stop.
  exec 9<"$lock"
  flock 9
  if ! alive "$run" || ! in_use; then
    "$pg_ctl" stop -D "$dir/data" -m immediate -w >/dev/null 2>&1
    # Removing can take half a minute on a busy disk: out of the way
    # under the lock, removed after it.
    gone="${dir%/*}/gone-${dir##*/run-}"
    mv "$dir" "$gone" && dir=$gone
    exec 9<&-
    rm -rf "$dir"
    exit 0
  fi
  exec 9<&-
  quiet=0
done
