#!/usr/bin/env bash
# Download PostgreSQL's server and the shared libraries it links as Debian packages into
# .debs/postgres/ (git-ignored), for scripts/gpu/search_scaling.sh on a GPU machine without
# network: carry `.debs` (and `.whl`) with the run; search_scaling.sh unpacks them with `dpkg -x`
# into /tmp, never into /. Also fetches the PostgreSQL driver wheels (psycopg, psycopg-binary)
# into .whl/ when none is there. Run here, as root, from anywhere:
#   bash scripts/gpu/fetch_postgres_debs.sh
# Measures nothing; no BENCHMARKS.md rows.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=.debs/postgres
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
ver=$(apt-cache depends postgresql | awk '/Depends: postgresql-[0-9]+$/ {sub("postgresql-", "", $2); print $2}' | head -n 1)
[ -n "$ver" ] || { echo "no postgresql-N package in apt's lists" >&2; exit 1; }
bin=/usr/lib/postgresql/$ver/bin
if [ ! -x "$bin/postgres" ]; then  # ldd needs the binaries once, to list the libraries they link
  apt-get install -y -qq "postgresql-$ver" >/dev/null
fi
# the packages of every library the server programs link, except the C runtime (glibc, libgcc,
# libstdc++ belong to the target system, which has newer ones)
libs=$(for b in postgres initdb pg_ctl; do ldd "$bin/$b" | awk '/=>/ {print $3}'; done | sort -u |
  while read -r f; do
    real=$(readlink -f "$f")
    for p in "$f" "$real" "${f/#\/lib\//\/usr\/lib\/}" "${real/#\/lib\//\/usr\/lib\/}"; do
      dpkg -S "$p" 2>/dev/null | head -n 1 | cut -d: -f1 && break
    done
  done | sort -u | grep -v -x -E 'libc6|libgcc-s1|libstdc\+\+6')
rm -rf "$DEST"
mkdir -p "$DEST"
(cd "$DEST" && apt-get download -qq "postgresql-$ver" $libs)
echo "$ver" > "$DEST/VERSION"
ls "$DEST"/*.deb | sed 's#.*/##' > "$DEST/PACKAGES"
echo "PostgreSQL $ver: $(wc -l < "$DEST/PACKAGES") packages, $(du -sh "$DEST" | cut -f1) in $DEST"

if ! ls .whl/psycopg-*.whl >/dev/null 2>&1; then
  pyver=$(python3 -c 'import psycopg; print(psycopg.__version__)' 2>/dev/null || echo 3.2.9)
  mkdir -p .whl
  for name in psycopg psycopg-binary; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d .whl "$name==$pyver" || echo "could not fetch $name==$pyver"
  done
  echo "driver wheels: $(ls .whl | grep -c psycopg) psycopg wheel(s) in .whl"
fi
