#!/bin/sh
# Installs Tierd on this host from a build tree: tierd and tierctl to /usr/local/bin, the systemd
# unit, the default config (never overwriting an edited one) and the sysusers.d entry; then creates
# the `tierd` user and `tier` group and reloads systemd when they are there. Idempotent (run it again
# after every build); uses no network.
#
# usage: deploy/install.sh [--build-dir DIR] [--destdir DIR] [--enable]
#   --build-dir DIR  build tree holding daemon/tierd and tierctl/tierctl (default: <repo>/build)
#   --destdir DIR    stage under DIR instead of / (packaging); skips users and systemctl
#   --enable         also enable tierd.service and (re)start it
set -eu

repo=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd)
build_dir="$repo/build"
destdir=""
enable=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --build-dir=*) build_dir=${1#*=}; shift ;;
    --destdir) destdir=$2; shift 2 ;;
    --destdir=*) destdir=${1#*=}; shift ;;
    --enable) enable=1; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [ -z "$destdir" ] && [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: run as root (or stage with --destdir DIR)" >&2
  exit 1
fi

tierd_bin="$build_dir/daemon/tierd"
tierctl_bin="$build_dir/tierctl/tierctl"
if [ ! -x "$tierd_bin" ]; then
  echo "install.sh: no $tierd_bin; build first (cmake --build $build_dir) or pass --build-dir" >&2
  exit 1
fi

# Identical files are left alone, so a re-run changes nothing (and keeps their mtimes).
put() {  # put MODE SOURCE DEST
  if cmp -s "$2" "$destdir$3"; then
    chmod "$1" "$destdir$3"
    echo "unchanged $destdir$3"
  else
    install -D -m "$1" "$2" "$destdir$3"
    echo "installed $destdir$3"
  fi
}

put 0755 "$tierd_bin" /usr/local/bin/tierd
if [ -x "$tierctl_bin" ]; then
  put 0755 "$tierctl_bin" /usr/local/bin/tierctl
else
  echo "install.sh: warning: no $tierctl_bin; tierctl not installed" >&2
fi
put 0644 "$repo/deploy/tierd.service" /etc/systemd/system/tierd.service
put 0644 "$repo/deploy/tierd.sysusers" /etc/sysusers.d/tierd.conf

# The config file belongs to the operator once installed: put ours next to an edited one instead.
conf="$destdir/etc/tierd/tierd.conf"
if [ ! -e "$conf" ]; then
  put 0644 "$repo/deploy/tierd.conf" /etc/tierd/tierd.conf
elif ! cmp -s "$repo/deploy/tierd.conf" "$conf"; then
  put 0644 "$repo/deploy/tierd.conf" /etc/tierd/tierd.conf.default
  echo "kept your $conf; the shipped defaults are in tierd.conf.default"
fi

if [ -n "$destdir" ]; then
  echo "staged under $destdir; users and systemd left alone"
  exit 0
fi

# The user the unit runs as and the group that may use the sockets.
if command -v systemd-sysusers >/dev/null 2>&1; then
  systemd-sysusers /etc/sysusers.d/tierd.conf
else
  getent group tier >/dev/null || groupadd --system tier
  getent passwd tierd >/dev/null ||
    useradd --system --gid tier --home-dir /var/lib/tierd --no-create-home \
      --shell /usr/sbin/nologin --comment "Tierd GPU memory-tiering daemon" tierd
fi

# Only where systemd is the running init (not in a container build, not under another init).
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  systemctl daemon-reload
  if [ "$enable" -eq 1 ]; then
    systemctl enable tierd.service
    systemctl restart tierd.service
    echo "tierd enabled and (re)started; check: systemctl status tierd"
  else
    echo "next: systemctl enable --now tierd; add users of Tierd to group 'tier'"
  fi
else
  echo "systemd is not running here: start /usr/local/bin/tierd --config=/etc/tierd/tierd.conf yourself"
fi
