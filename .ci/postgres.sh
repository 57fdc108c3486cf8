#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for the database tests and print its URL; stop it with
# `.ci/postgres.sh stop DIR`. The distribution's postgresql package is installed when missing
# (as root), or FA_AUTOTUNE_PG_BIN names a bin directory; the cluster lives in a temporary
# directory, trusts local TCP connections on a free port and belongs to the `postgres` user
# (created when missing: PostgreSQL refuses to run as root).
#
#   eval "$(.ci/postgres.sh start)"   # sets FA_AUTOTUNE_TEST_PG_URL and FA_AUTOTUNE_TEST_PG_DIR
#   .ci/postgres.sh stop "$FA_AUTOTUNE_TEST_PG_DIR"
set -euo pipefail

bindir() {
    local found
    if [ -n "${FA_AUTOTUNE_PG_BIN:-}" ]; then  # e.g. the pgserver wheel's pgserver/pginstall/bin
        echo "$FA_AUTOTUNE_PG_BIN"; return
    fi
    found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
    if [ -z "$found" ] && [ "$(id -u)" = 0 ]; then
        (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql) >&2
        found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
    fi
    [ -n "$found" ] || { echo "no PostgreSQL found and cannot install it" >&2; exit 1; }
    echo "$found"
}

as_owner() {  # run a server command as the cluster's owner
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "${1:-start}" in
start)
    bin=$(bindir)
    dir=$(mktemp -d /tmp/fa-autotune-pg.XXXXXX)
    if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then useradd -M -s /bin/false postgres; fi
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 >"$dir/initdb.log" 2>&1
    as_owner "$bin/pg_ctl" -D "$dir/data" -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200" \
        -l "$dir/server.log" -w start >&2
    echo "export FA_AUTOTUNE_TEST_PG_URL=postgresql+psycopg://postgres@127.0.0.1:$port/postgres"
    echo "export FA_AUTOTUNE_TEST_PG_DIR=$dir"
    ;;
stop)
    dir=$2
    as_owner "$(bindir)/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
    rm -rf "$dir"
    ;;
esac
