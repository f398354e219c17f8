#!/usr/bin/env bash
# Install (Debian's package) and start a PostgreSQL server on loopback for the storage tests,
# with a role and database 'tuner' (password 'tuner'). Prints the URL to use. Idempotent.
set -euo pipefail
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq postgresql >/dev/null
fi
ver=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
if ! pg_lsclusters -h 2>/dev/null | grep -q "^$ver main"; then
  pg_createcluster "$ver" main >/dev/null
fi
if ! pg_lsclusters -h | grep -q "^$ver main .* online"; then
  pg_ctlcluster "$ver" main start
fi
for _ in $(seq 1 30); do
  su postgres -c "pg_isready -q -h 127.0.0.1" && break
  sleep 1
done
su postgres -c "psql -qtA -c \"SELECT 1 FROM pg_roles WHERE rolname='tuner'\"" | grep -q 1 \
  || su postgres -c "psql -q -c \"CREATE ROLE tuner LOGIN SUPERUSER PASSWORD 'tuner'\""
su postgres -c "psql -qtA -c \"SELECT 1 FROM pg_database WHERE datname='tuner'\"" | grep -q 1 \
  || su postgres -c "createdb -O tuner tuner"
echo "postgresql://tuner:tuner@127.0.0.1:5432/tuner"
