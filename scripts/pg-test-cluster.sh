#!/usr/bin/env bash
# Starts or stops the private PostgreSQL cluster the test command shares between
# test processes:  pg-test-cluster.sh start DIR  (prints the server URI)
#                  pg-test-cluster.sh stop DIR
# The server listens on 127.0.0.1 only, with fsync on (WAYSTONE_PG_SERVER_OPTIONS adds
# server options, e.g. "-c shared_preload_libraries=pg_stat_statements"). As root it runs as the
# `postgres` user, since PostgreSQL refuses root.
set -euo pipefail
action="$1" dir="$2"
bindir="$(dirname "$(command -v initdb 2>/dev/null || ls /usr/lib/postgresql/*/bin/initdb | tail -1)")"
as_server() { if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
case "$action" in
  start)
    mkdir -p "$dir"
    [[ $(id -u) -eq 0 ]] && chown postgres: "$dir"
    as_server "$bindir/initdb" -D "$dir/data" -U waystone --auth=trust -E UTF8 --no-sync >/dev/null
    port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || shuf -i 20000-60000 -n 1)"
    as_server "$bindir/pg_ctl" -D "$dir/data" -w -l "$dir/server.log" \
      -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=300 ${WAYSTONE_PG_SERVER_OPTIONS:-}" start >/dev/null
    echo "postgresql://waystone@127.0.0.1:$port"
    ;;
  stop)
    # Immediate: the cluster is deleted next, so its shutdown checkpoint (20 s of fsyncs
    # after a test run) would be written for nothing.
    as_server "$bindir/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null || true
    # After a whole test run the folder holds a database per test (gigabytes in ~10^5
    # files): deleting it took 20-25 s of waiting on the disk at the end of every run.
    # Renamed at once, so the folder is gone when this returns; deleted in the
    # background, in a session of its own with no terminal or pipe, at idle priority.
    trash="$(mktemp -d "${dir%/}.deleting.XXXXXX")"
    mv "$dir" "$trash/" && setsid nice -n 19 ionice -c 3 rm -rf "$trash" </dev/null >/dev/null 2>&1 &
    ;;
esac
